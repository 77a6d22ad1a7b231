#!/usr/bin/env bash
# Installs what fp8lab needs (Debian packages), builds it, and runs the main job on its
# default data: the paper's Table 1 (dynamic range and SNR of formats), Appendix A (SNR of
# the 8-bit scaled integer, measured and modelled), then `fp8lab quickstart`: a small
# ResNet trained on Fashion-MNIST in float32 and with the paper's 1.4.3/1.5.2 recipe
# (a few minutes on 2 cores).
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
echo
echo "== Quickstart: ResNet-8 on Fashion-MNIST, float32 versus 1.4.3/1.5.2 =="
build/fp8lab quickstart
