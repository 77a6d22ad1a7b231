#!/usr/bin/env bash
# Training throughput of every model preset, float32 against the paper's 8-bit recipe for
# that model, the latter with its products in float32 (quant.compute = fp32) and on the
# compute layer's choice (auto: bfloat16 on AMX where the CPU has it, docs/spec.md §7). Image models train on synthetic data of their usual input size (no data set
# needed); the Transformers and BERTs on the Bible corpus (prepared from Debian's SWORD
# modules into data/bible-en-es on first use). Prints a Markdown table of samples/s of the
# training loop (the first step, evaluation and checkpoints excluded). Both recipes run with
# train.flush_denormals: float32 training on a CPU otherwise pays for denormal operands
# (up to 1.6x on the Transformers here), which the 8-bit formats flush anyway, and the
# comparison is meant to show the cost of quantization.
#   scripts/throughput.sh [STEPS] [PRESET...]     (default 6 timed steps; all presets)
#   ROUNDS=1 scripts/throughput.sh                 (one run per recipe instead of two)
set -euo pipefail
cd "$(dirname "$0")/.."
FP8LAB=${FP8LAB:-build/fp8lab}
STEPS=${1:-6}
ROUNDS=${ROUNDS:-2}  # fp32 and 8-bit alternate this many times; each cell is the best round
shift || true
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# preset  task  input  batch  recipe
rows=(
  "resnet20 image 32 128 resnet32-mixed"
  "resnet32 image 32 128 resnet32-mixed"
  "resnet56 image 32 128 resnet32-mixed"
  "resnet18 image 224 16 resnet18-mixed"
  "resnet50 image 224 8 resnet50-mixed"
  "efficientnet-b0 image 224 16 efficientnet-mixed"
  "efficientnet-b2 image 260 8 efficientnet-mixed"
  "efficientnet-b4 image 380 4 efficientnet-mixed"
  "transformer-tiny translation 128 64 transformer-mixed"
  "transformer-small translation 128 32 transformer-mixed"
  "transformer-base translation 128 16 transformer-mixed"
  "bert-tiny bert 128 64 bert-mixed"
  "bert-base bert 128 16 bert-mixed"
  "bert-large bert 128 4 bert-mixed"
)
echo "| model | input | batch | recipe | fp32 samples/s | 8-bit samples/s | 8-bit / fp32 time | 8-bit auto samples/s | 8-bit auto / fp32 time |"
echo "|---|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  read -r model task size batch recipe <<<"$row"
  if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$model"; then continue; fi
  # variant: recipe/compute
  variants=("fp32/fp32" "$recipe/fp32" "$recipe/auto")
  declare -A sps=()
  for v in "${variants[@]}"; do sps[$v]=0; done
  for round in $(seq "$ROUNDS"); do
  for v in "${variants[@]}"; do
    r=${v%/*}
    compute=${v#*/}
    common=(--no-progress --db "$T/t.db" --set name=tp --set model.name="$model" --set train.batch="$batch"
            --set train.steps=$((STEPS + 1)) --set quant.recipe="$r" --set quant.compute="$compute"
            --set "train.checkpoint=$T/c.ckpt" --set train.flush_denormals=true)
    case $task in
      image) extra=(--set data.name=synthetic --set data.image_size="$size" --set data.synthetic_classes=10
                    --set data.synthetic_train=$((batch * (STEPS + 1))) --set data.synthetic_test=$batch) ;;
      translation) extra=(--set task=translation --set data.name=bible-en-es --set data.test_limit=1
                          --set optimizer.name=adam --set optimizer.weight_decay=0) ;;
      bert) extra=(--set task=bert --set data.name=bible-en --set data.test_limit=2
                   --set optimizer.name=adamw --set optimizer.weight_decay=0.01) ;;
    esac
    out=$("$FP8LAB" train "${common[@]}" "${extra[@]}" 2>/dev/null)
    # The best round: a shared machine's noise only ever slows a run down.
    sps[$v]=$(awk -v best="${sps[$v]}" 'NR==3 { v = $(NF-1); print (v > best ? v : best) }' <<<"$out")
  done
  done
  ratio() { awk -v a="${sps[fp32/fp32]}" -v b="${sps[$1]}" 'BEGIN { printf "%.2f", a / b }'; }
  case $task in image) input="${size}x${size}" ;; *) input="verses, <= $size tokens" ;; esac
  echo "| $model | $input | $batch | $recipe | ${sps[fp32/fp32]} | ${sps[$recipe/fp32]} | $(ratio "$recipe/fp32") |" \
       "${sps[$recipe/auto]} | $(ratio "$recipe/auto") |"
  unset sps
done
