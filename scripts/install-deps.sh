#!/usr/bin/env bash
# Installs the Debian packages fp8lab needs to build and test. Idempotent; run as root
# (or with sudo available). Set FP8LAB_SKIP_APT=1 to skip when the packages are known present.
set -euo pipefail
[ "${FP8LAB_SKIP_APT:-0}" = 1 ] && exit 0
pkgs=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  libhwy-dev libcli11-dev libfmt-dev nlohmann-json3-dev libtomlplusplus-dev libsqlite3-dev libstb-dev fonts-dejavu-core
  libgtest-dev libgmock-dev libbenchmark-dev
  libtorch-dev libdnnl-dev libopenblas0-pthread zlib1g-dev libgloo-dev
  python3-dev pybind11-dev python3-torch python3-numpy python3-pytest python3-setuptools python3-pip
  dataset-fashion-mnist
  sword-text-kjv sword-text-sparv libsword-utils sentencepiece
)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then echo "install-deps: all ${#pkgs[@]} packages present"; exit 0; fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
