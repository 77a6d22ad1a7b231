"""Shared fixtures of the pytest suite (run by CTest with PYTHONPATH=<build>/python)."""
import os
import pathlib
import subprocess

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("FP8LAB_BUILD", REPO / "build"))


@pytest.fixture(scope="session")
def cli():
    """Runs the fp8lab command-line program of the same build: cli('quantize', ...)."""
    exe = BUILD / "fp8lab"
    if not exe.exists():
        pytest.fail(f"{exe} is missing: build the project first (cmake --build build)")

    def run(*args):
        r = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(f"fp8lab {' '.join(map(str, args))} failed:\n{r.stderr}")
        return r.stdout
    return run


def same(a, b):
    """Two tensors of float32 values equal bit for bit (shape and every value's bits)."""
    import torch  # here, so that the suites without torch do not import it
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (a - b).abs().max()


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def pytest_configure(config):
    config.addinivalue_line("markers", "exhaustive: every float32 input (CTest label exhaustive; about an hour)")


def pytest_collection_modifyitems(config, items):
    """Exhaustive tests run only when asked for (-m exhaustive)."""
    if "exhaustive" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="all 2^32 inputs: run with -m exhaustive")
    for item in items:
        if "exhaustive" in item.keywords:
            item.add_marker(skip)
