#!/usr/bin/env bash
# Makes the project's Python environment: .venv beside this folder, from the first python3
# on PATH (or $FP8LAB_PYTHON), with requirements.txt installed (torch==2.13.0 and the pinned
# package and test dependencies). Idempotent: an environment that has them is left as it is.
# Every libtorch target, test and the Python package build against this environment's torch
# (cmake/torch.cmake).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${FP8LAB_PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup-python: making .venv with $("$python" --version 2>&1) ($(command -v "$python"))"
  "$python" -m venv .venv
fi
# Already satisfied: pip's check is quick and installs nothing. pip's notes about the
# machine's local package folders are left out of what it prints.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt >"$log" 2>&1 || status=$?
grep -v "^WARNING: Location .* is ignored" "$log" >&2 || true
[ "$status" -eq 0 ] || { echo "setup-python: pip install -r requirements.txt failed ($status)" >&2; exit "$status"; }
.venv/bin/python -c "import torch, numpy, ml_dtypes, scipy; print('setup-python: torch', torch.__version__, 'in', __import__('sys').prefix)"
