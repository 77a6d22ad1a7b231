#!/bin/bash
# Training speed of two builds of fp8lab, alternately, on the command of issue 43 (ResNet-20,
# batch 128, Fashion-MNIST, products on bfloat16 where exact), one thread pinned to core
# CORE: samples/s of each, ROUNDS rounds per recipe.
#   bench/ab_train.sh OLD_FP8LAB NEW_FP8LAB [RECIPE...]      (default recipes: fp32 mxfp8 mxfp4 nvfp4)
#   environment: STEPS (24), ROUNDS (3), CORE (1)
# OLD_FP8LAB: e.g. a copy of build/fp8lab and build/libfp8lab_cli.so made at the older commit.
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,7p' "$0"; exit 2; fi
old=$1 new=$2
shift 2
recipes=("$@")
[ ${#recipes[@]} -gt 0 ] || recipes=(fp32 mxfp8 mxfp4 nvfp4)
db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
run() {  # binary recipe -> samples/s
  rm -f "$db"/ab.db*
  taskset -c "${CORE:-1}" "$1" train configs/resnet8-fmnist.toml --set model.name=resnet20 --set train.batch=128 \
    --set train.steps="${STEPS:-24}" --set train.flush_denormals=true --set threads=1 --set "quant.recipe=$2" \
    --set quant.compute=auto --set data.test_limit=512 --set train.checkpoint="$db/ab.ckpt" --db "$db/ab.db" \
    --no-progress 2>"$db/stderr" | awk '/finished/ {print $(NF-1)}' || { cat "$db/stderr" >&2; return 1; }
}
for r in "${recipes[@]}"; do
  for i in $(seq "${ROUNDS:-3}"); do
    echo "$r round $i: old $(run "$old" "$r") new $(run "$new" "$r")"
  done
done
