#!/usr/bin/env bash
# Installs what fp8lab needs to build and test: the Debian packages (as root, or with sudo
# available), then the project's Python environment with PyTorch from pip
# (scripts/setup-python.sh). Idempotent. Set FP8LAB_SKIP_APT=1 to skip the Debian packages
# when they are known present.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  libhwy-dev libcli11-dev libfmt-dev nlohmann-json3-dev libtomlplusplus-dev libsqlite3-dev libstb-dev fonts-dejavu-core
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev zlib1g-dev libgloo-dev
  dataset-fashion-mnist
  sword-text-kjv sword-text-sparv libsword-utils sentencepiece
)
install_debian() {
  local missing=() p
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -eq 0 ]; then echo "install-deps: all ${#pkgs[@]} Debian packages present"; return; fi
  local SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
[ "${FP8LAB_SKIP_APT:-0}" = 1 ] || install_debian
"$(dirname "$0")/setup-python.sh"
