#!/usr/bin/env bash
# Training throughput of every model preset, float32 against the paper's 8-bit recipe for
# that model, on synthetic data of the model's usual input size (so no data set is needed).
# Prints a Markdown table (samples/s of the training loop, evaluation excluded).
#   scripts/throughput.sh [STEPS]        (default 6 steps per run after one warm-up step)
set -euo pipefail
cd "$(dirname "$0")/.."
FP8LAB=${FP8LAB:-build/fp8lab}
STEPS=${1:-6}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# preset  image-size  batch  recipe  [extra --set]
rows=(
  "resnet20 32 128 resnet32-mixed"
  "resnet32 32 128 resnet32-mixed"
  "resnet56 32 128 resnet32-mixed"
  "resnet18 224 16 resnet18-mixed"
  "resnet50 224 8 resnet50-mixed"
  "efficientnet-b0 224 16 efficientnet-mixed"
  "efficientnet-b2 260 8 efficientnet-mixed"
  "efficientnet-b4 380 4 efficientnet-mixed"
)
echo "| model | input | batch | recipe | fp32 samples/s | 8-bit samples/s | 8-bit / fp32 time |"
echo "|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  read -r model size batch recipe <<<"$row"
  n=$((batch * (STEPS + 1)))
  declare -A sps=()
  for r in fp32 "$recipe"; do
    out=$("$FP8LAB" train /dev/null --no-progress --db "$T/t.db" \
      --set name=tp --set model.name="$model" --set data.name=synthetic --set data.image_size="$size" \
      --set data.synthetic_train=$n --set data.synthetic_test=$batch --set data.synthetic_classes=10 \
      --set train.batch="$batch" --set train.steps=$((STEPS + 1)) --set quant.recipe="$r" \
      --set "train.checkpoint=$T/c.ckpt" 2>/dev/null)
    # samples/s excludes the first step (allocation, oneDNN kernel selection).
    sps[$r]=$(awk 'NR==3 {print $(NF-1)}' <<<"$out")
  done
  ratio=$(awk -v a="${sps[fp32]}" -v b="${sps[$recipe]}" 'BEGIN { printf "%.2f", a / b }')
  echo "| $model | ${size}x${size} | $batch | $recipe | ${sps[fp32]} | ${sps[$recipe]} | $ratio |"
done
