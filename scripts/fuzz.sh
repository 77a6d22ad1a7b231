#!/usr/bin/env bash
# Fuzzes every parser of outside input with clang's libFuzzer (AddressSanitizer and
# UndefinedBehaviorSanitizer on): format strings (scaled ones too) and recipe lines, recipe
# TOML, .npy, IDX, SWORD imp text, configs, sweep files, checkpoint headers, code sets with
# their manifests, the Slurm emitter. Each target starts from its committed seed corpus (tests/fuzz/corpus/NAME)
# and first replays the regression inputs (tests/fuzz/regressions/NAME: every crash found
# stays there as a test).
#   scripts/fuzz.sh            20 seconds per target (what CI runs)
#   scripts/fuzz.sh 600        ten minutes per target; new corpus entries go to build-fuzz/corpus
#   scripts/fuzz.sh 60 npy     one target
#   FUZZ_SEED=0 scripts/fuzz.sh 600   a different random seed each run (default 1: CI repeats itself)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(format recipe_toml npy idx imp config sweep checkpoint_header cifar bitext code_set slurm)
CXX=clang++ CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFP8LAB_FUZZ=ON \
  -DFP8LAB_WITH_TORCH=OFF -DFP8LAB_BUILD_APPS=OFF -DFP8LAB_BUILD_TESTS=OFF -DFP8LAB_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz --target "${targets[@]/#/fuzz_}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=0
for t in "${targets[@]}"; do
  work=build-fuzz/corpus/$t
  mkdir -p "$work" build-fuzz/crashes
  regressions=tests/fuzz/regressions/$t
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    build-fuzz/fuzz_$t "$regressions"/* >/dev/null 2>&1 || { echo "fuzz $t: a regression input fails"; failed=1; }
  fi
  if build-fuzz/fuzz_$t "$work" "tests/fuzz/corpus/$t" -max_total_time="$seconds" -max_len=65536 -seed="${FUZZ_SEED:-1}" \
       -rss_limit_mb=2048 -artifact_prefix=build-fuzz/crashes/$t- -print_final_stats=1 >build-fuzz/$t.log 2>&1; then
    echo "fuzz $t: $(grep -o 'stat::number_of_executed_units: *[0-9]*' build-fuzz/$t.log | grep -o '[0-9]*$') inputs, no failure"
  else
    echo "fuzz $t: FAILED, see build-fuzz/$t.log and build-fuzz/crashes/"
    tail -30 build-fuzz/$t.log
    failed=1
  fi
done
exit $failed
