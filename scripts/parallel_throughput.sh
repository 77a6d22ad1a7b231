#!/usr/bin/env bash
# Data-parallel training throughput on this machine (docs/training.md): the same 8-bit
# training step as one process with all cores' threads, and as `--nproc N` processes with
# one share of the cores each, the global batch as N micro-batches (gradients sent during
# the backward pass, and all after it: --bucket-kb 0); and the communication
# each process pays per step (time in collectives, bytes sent), with gradients travelling in
# float32 and in MXFP8 (quant.grad_comm). ResNet-20 trains on synthetic 32x32 images, the
# Transformer on the Bible corpus (prepared into data/bible-en-es on first use). Prints a
# Markdown table; each cell is the best of ROUNDS runs (noise only slows a run down).
#   scripts/parallel_throughput.sh [STEPS]        (default 20 timed steps)
set -euo pipefail
cd "$(dirname "$0")/.."
FP8LAB=${FP8LAB:-build/fp8lab}
STEPS=${1:-20}
ROUNDS=${ROUNDS:-2}
N=${NPROC:-2}
CORES=$(nproc)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# model  task  batch  recipe
rows=(
  "resnet20 image 128 resnet32-mixed"
  "transformer-tiny translation 64 transformer-mixed"
)
# label | processes | threads per process | micro-batches | gradients travel in | --bucket-kb
each=$((CORES / N))
plural() { [ "$1" -eq 1 ] && echo "$1 $2" || echo "$1 $2s"; }
variants=(
  "1 process x $(plural "$CORES" thread)|1|$CORES|1|fp32"
  "1 process x $(plural "$CORES" thread), $N micro-batches|1|$CORES|$N|fp32"
  "$N processes x $(plural "$each" thread), gradients sent after backward|$N|$each|$N|fp32|0"
  "$N processes x $(plural "$each" thread)|$N|$each|$N|fp32"
  "$N processes x $(plural "$each" thread), MXFP8 gradients|$N|$each|$N|mxfp8_e5m2"
)
echo "| model | batch | how | samples/s | vs 1 process | collectives ms/step | kB sent/step | of which gradients |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  read -r model task batch recipe <<<"$row"
  base=0
  for v in "${variants[@]}"; do
    IFS='|' read -r label procs threads micro comm bucket <<<"$v"
    best=0 ms=- kb=- gkb=-
    for _ in $(seq "$ROUNDS"); do
      rm -f "$T"/*
      common=(--no-progress --db "$T/t.db" --set name=tp --set model.name="$model" --set train.batch="$batch"
              --set train.steps=$((STEPS + 1)) --set quant.recipe="$recipe" --set threads="$threads"
              --set train.micro_batches="$micro" --set quant.grad_comm="$comm"
              --set "train.checkpoint=$T/c.ckpt" --set train.flush_denormals=true)
      case $task in
        image) extra=(--set data.name=synthetic --set data.image_size=32 --set data.synthetic_classes=10
                      --set data.synthetic_train=$((batch * (STEPS + 1))) --set data.synthetic_test=$batch) ;;
        translation) extra=(--set task=translation --set data.name=bible-en-es --set data.test_limit=1
                            --set optimizer.name=adam --set optimizer.weight_decay=0) ;;
      esac
      nproc=()
      [ "$procs" -gt 1 ] && nproc=(--nproc "$procs" --bucket-kb "${bucket:-1024}")
      out=$("$FP8LAB" train "${common[@]}" "${extra[@]}" "${nproc[@]}" 2>"$T/err")
      sps=$(awk 'NR==3 { print $(NF-1) }' <<<"$out")
      if awk -v a="$sps" -v b="$best" 'BEGIN { exit !(a > b) }'; then
        best=$sps
        if [ "$procs" -gt 1 ]; then
          ms=$(sqlite3 "$T/t.db" "SELECT printf('%.1f', 1000 * value) FROM metrics WHERE name = 'comm_seconds_per_step'")
          kb=$(sqlite3 "$T/t.db" "SELECT printf('%.0f', value / 1000) FROM metrics WHERE name = 'comm_bytes_per_step'")
          gkb=$(sqlite3 "$T/t.db" "SELECT printf('%.0f', value / 1000) FROM metrics WHERE name = 'comm_gradient_bytes_per_step'")
        fi
      fi
    done
    [ "$base" = 0 ] && base=$best
    ratio=$(awk -v a="$best" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
    echo "| $model | $batch | $label | $best | $ratio | $ms | $kb | $gkb |"
  done
done
