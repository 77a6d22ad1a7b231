#!/bin/bash
# Training speed of recipes on one build, alternately, on one thread pinned to core CORE:
# samples/s of each recipe, ROUNDS rounds (recipes in turn within a round, so that a slow
# spell of the machine hits all of them alike), products on bfloat16 where exact.
#   bench/recipe_speed.sh CONFIG RECIPE... [-- --set KEY=VALUE ...]
#   environment: FP8LAB (build/fp8lab), STEPS (16), ROUNDS (2), CORE (1)
# e.g. bench/recipe_speed.sh configs/gpt-tiny-bible.toml fp32 tensor-current deepseek
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,7p' "$0"; exit 2; fi
config=$1
shift
recipes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do recipes+=("$1"); shift; done
[ $# -gt 0 ] && shift
extra=("$@")
db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
run() {  # recipe -> samples/s
  rm -f "$db"/r.db* "$db"/r.ckpt*
  taskset -c "${CORE:-1}" "${FP8LAB:-build/fp8lab}" train "$config" --set train.steps="${STEPS:-16}" \
    --set threads=1 --set "quant.recipe=$1" --set quant.compute=auto --set data.test_limit=64 \
    --set train.checkpoint="$db/r.ckpt" ${extra[@]+"${extra[@]}"} --db "$db/r.db" --no-progress 2>"$db/stderr" |
    awk '/finished/ {print $(NF-1)}' || { cat "$db/stderr" >&2; return 1; }
}
for i in $(seq "${ROUNDS:-2}"); do
  for r in "${recipes[@]}"; do echo "round $i $r: $(run "$r")"; done
done
