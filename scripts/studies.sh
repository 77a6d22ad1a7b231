#!/usr/bin/env bash
# Reproduces the studies under docs/results/: runs each sweep of configs/sweeps/ (skipping
# runs the store already holds) and writes its report (tables and plots).
#   scripts/studies.sh                         # every sweep of configs/sweeps/ (wall times: docs/results/README.md)
#   scripts/studies.sh fmnist-recipes          # one
#   JOBS=1 DB=my.db scripts/studies.sh ...     # options: FP8LAB, DB, JOBS, RUNS, OUT
set -euo pipefail
cd "$(dirname "$0")/.."
FP8LAB=${FP8LAB:-build/fp8lab}
DB=${DB:-results/studies.db}
JOBS=${JOBS:-2}
RUNS=${RUNS:-runs}
OUT=${OUT:-docs/results}
mkdir -p "$(dirname "$DB")"
studies=("$@")
if [ ${#studies[@]} -eq 0 ]; then  # every sweep file
  for f in configs/sweeps/*.toml; do studies+=("$(basename "$f" .toml)"); done
fi
for s in "${studies[@]}"; do
  start=$(date +%s)
  "$FP8LAB" sweep "configs/sweeps/$s.toml" --db "$DB" --jobs "$JOBS" --dir "$RUNS/$s" --no-progress
  "$FP8LAB" report "configs/sweeps/$s.toml" --db "$DB" --out "$OUT/$s" > /dev/null
  echo "$s: sweep and report took $(( $(date +%s) - start )) s" >&2
done
