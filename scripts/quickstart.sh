#!/usr/bin/env bash
# Installs what fp8lab needs (Debian packages), builds it, and runs the main job on its
# default data: the paper's Table 1 (dynamic range and SNR of formats) and Appendix A
# (SNR of the 8-bit scaled integer at three quantization steps, measured and modelled).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
echo
echo "== Table 1: dynamic range and SNR of floating-point formats =="
build/fp8lab formats
echo
echo "== Appendix A: 8-bit scaled integer (1.0.7) on a standard normal signal =="
build/fp8lab snr 1.0.7:-2 1.0.7:-1 1.0.7:0 1.4.3 1.5.2
