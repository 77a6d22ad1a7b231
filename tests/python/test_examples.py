"""The examples of examples/python run as a user runs them (shortened), and their runs land
in the results store. The full-length runs and their accuracies are in docs/results/python.md."""
import json
import os
import subprocess
import sys

import pytest

import fp8lab
from conftest import REPO

EXAMPLES = REPO / "examples" / "python"


def run_example(name, *args):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(fp8lab.__file__)))  # this fp8lab
    r = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], capture_output=True, text=True,
                       env=env, cwd=EXAMPLES, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_fashion_mnist_cnn_in_8_bits(tmp_path, cli):
    if not (EXAMPLES / "common.py").exists():
        pytest.fail("examples/python is missing")
    db = tmp_path / "runs.db"
    out = run_example("fmnist_cnn.py", "--train-limit", 6000, "--epochs", 1, "--db", db)
    acc = float(out.strip().splitlines()[-1].split()[-2])
    assert acc > 60, out  # about 75 % after one epoch over 6000 images; 10 % is chance
    rows = json.loads(cli("runs", "--db", db, "--json"))
    assert [(r["name"], r["status"], r["recipe"]) for r in rows] == [
        ("python-fmnist-resnet8", "finished", "resnet32-mixed")]
    assert rows[0]["final_metric"] == pytest.approx(acc)


def test_attention_model_in_8_bits():
    out = run_example("attention.py", "--steps", 150)
    lines = out.strip().splitlines()
    assert "became QuantMatmul" in out and "self_attn.scores" in out
    acc = {l.split(":")[0]: float(l.split()[-2]) for l in lines[-2:]}
    assert len(acc) == 2 and min(acc.values()) > 50, out  # chance: 6 %


def test_llama_on_the_bible_in_nvfp4(tmp_path):
    """Shortened: 30 steps of a narrower Llama; the loss falls from log(256) = 5.5 nats/byte
    and every run's curve lands in the plot."""
    out = run_example("llama_bible.py", "--steps", 30, "--width", 32, "--length", 32, "--batch", 8,
                      "--data", REPO / "data" / "bible-en-es", "--out", tmp_path / "loss")
    dev = {l.split(":")[0]: float(l.split()[3]) for l in out.splitlines() if "validation loss" in l}
    assert set(dev) == {"fp32", "transformer-mixed", "nvfp4"} and max(dev.values()) < 4.5, out
    assert "(19 quantized layers)" in out  # 2 blocks of q, k, v, scores, context, o, gate, up, down; lm_head
    svg = (tmp_path / "loss.svg").read_text()
    assert all(r in svg for r in dev) and (tmp_path / "loss.png").stat().st_size > 1000
