#!/usr/bin/env bash
# Installs fp8lab the way a PyTorch user would and checks it from an empty folder
# (docs/python.md, "Building and installing"):
#   1. a fresh virtual environment with torch==2.13.0 (the wheel on disk) and the package's
#      build and test needs, pinned as in requirements.txt;
#   2. pip install --no-build-isolation of this source tree into it;
#   3. from an empty folder: import fp8lab; its wheel tag; quantize against ml_dtypes and
#      against the CLI of build/ (when built); a quantized plain model trains a step; and
#      a different torch version is refused at import.
#   scripts/check-pip-install.sh            (about 15 minutes on 2 cores: the C++ build)
# Needs the Debian packages of scripts/install-deps.sh.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pins() { grep -E "^($(IFS='|'; echo "$*"))==" "$src/requirements.txt"; }
# pip install quietly, without its notes on the machine's local package folders; fails as pip does.
pip_install() {
  local status=0
  "$work/env/bin/python" -m pip install -q --disable-pip-version-check "$@" >"$work/pip.log" 2>&1 || status=$?
  grep -v "^WARNING: Location .* is ignored" "$work/pip.log" >&2 || true
  [ "$status" -eq 0 ] || { echo "check-pip-install: pip install $* failed ($status)" >&2; exit "$status"; }
}
python3 -m venv "$work/env"
pip_install $(pins torch numpy ml_dtypes scikit-build-core)
echo "check-pip-install: building and installing into $work/env"
pip_install --no-build-isolation "$src"
mkdir "$work/empty"
cd "$work/empty"
FP8LAB_CLI="$src/build/fp8lab" "$work/env/bin/python" - <<'EOF'
import glob, os, subprocess, sys, tempfile

import ml_dtypes
import numpy as np
import torch

import fp8lab
import fp8lab.torch as ft

where = os.path.dirname(fp8lab.__file__)
assert where.startswith(sys.prefix), f"fp8lab imported from {where}, not the environment"
tags = [open(p).read() for p in glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "fp8lab-*.dist-info", "WHEEL"))]
assert tags and "Tag: cp3" in tags[0] and "linux_x86_64" in tags[0] and "none-any" not in tags[0], tags
print("wheel:", [l for l in tags[0].splitlines() if l.startswith("Tag")][0])

x = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32) * 100
codes = fp8lab.encode(x, "e4m3fn", overflow="nan")
assert (codes == x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)).all()
y = fp8lab.quantize(x, "e5m2", overflow="inf")
assert (y.view(np.uint32) == x.astype(ml_dtypes.float8_e5m2).astype(np.float32).view(np.uint32)).all()
print("quantize equals ml_dtypes on", x.size, "values")

cli = os.environ["FP8LAB_CLI"]
if os.path.exists(cli):
    with tempfile.TemporaryDirectory() as d:
        np.save(f"{d}/x.npy", x)
        subprocess.run([cli, "quantize", f"{d}/x.npy", f"{d}/y.npy", "-f", "1.4.3:10"], check=True, capture_output=True)
        assert (np.load(f"{d}/y.npy").view(np.uint32) == fp8lab.quantize(x, "1.4.3:10").view(np.uint32)).all()
    print("quantize equals the CLI")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 26 * 26, 10))
model = ft.quantize_model(model, "resnet32-mixed")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
xb, yb = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
losses = []
for _ in range(3):
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
assert losses[-1] < losses[0], losses
print("quantize_model trains:", [round(l, 4) for l in losses])
EOF
# Another torch than the one built against: refused at import, with both versions named.
sed -i 's/^TORCH_VERSION = .*/TORCH_VERSION = "2.99.0"/' "$("$work/env/bin/python" -c 'import fp8lab._build as b; print(b.__file__)' 2>/dev/null || find "$work/env" -name _build.py -path '*fp8lab*')"
if "$work/env/bin/python" -c "import fp8lab" 2>"$work/err"; then
  echo "check-pip-install: a different torch was not refused" >&2; exit 1
fi
grep -q "built against torch 2.99.0" "$work/err" || { cat "$work/err" >&2; exit 1; }
echo "check-pip-install: a different torch is refused at import"
echo "check-pip-install: passed"
