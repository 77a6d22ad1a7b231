#!/usr/bin/env bash
# Builds and runs every test (GoogleTest suites and the CLI checks) with CTest.
#   scripts/test.sh              Release build in build/
#   scripts/test.sh --sanitize   core, kernel, results and study tests under ASan + UBSan in build-asan/
#   scripts/test.sh --without-torch   the build without libtorch (FP8LAB_WITH_TORCH=OFF) in
#                                build-notorch/: its tests and the CLI's study commands
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  dir=build-asan
  # libtorch itself is not instrumented: the sanitizer run covers core and kernels.
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DFP8LAB_SANITIZE=ON -DFP8LAB_BUILD_BENCH=OFF
         -DFP8LAB_BUILD_APPS=OFF -DFP8LAB_WITH_TORCH=OFF)
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
elif [ "${1:-}" = "--without-torch" ]; then
  dir=build-notorch
  flags=(-DCMAKE_BUILD_TYPE=Release -DFP8LAB_WITH_TORCH=OFF -DFP8LAB_BUILD_BENCH=OFF)
else
  dir=build
  flags=(-DCMAKE_BUILD_TYPE=Release)
fi
cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
cmake --build "$dir"
# The all-inputs check (label exhaustive; README.md gives its duration) runs with: ctest --test-dir build -L exhaustive
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" -LE exhaustive
