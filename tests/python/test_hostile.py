"""Hostile input to the Python API (docs/reliability.md, "Python"): every call ends in its
result or a clear ValueError/TypeError naming the problem; none crashes the interpreter, hangs,
or does silently something other than what was asked. One test per class of defect a probe of
the API found."""
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fp8lab
import fp8lab.torch as ft

BACKENDS = ("kernels", "torch")


def nvfp4_codes():
    return fp8lab.encode(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32), "nvfp4")


# --- crashes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("call", ["ft.linear(torch.randn(2, 8), torch.randn(4, 8), None, None)",
                                  "ft.matmul(torch.randn(2, 8), torch.randn(8, 4), None)",
                                  "ft.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), None, None)",
                                  "ft.conv(torch.randn(1, 3, 8), torch.randn(4, 3, 3), None, None)"])
def test_a_product_without_a_layer_state_is_refused_not_a_crash(call):
    # A None layer reached C++ as a null pointer: the interpreter died by SIGSEGV. Run in a
    # child so that a regression fails this test instead of ending the whole run.
    code = f"import torch, fp8lab.torch as ft\ntry:\n    {call}\nexcept ValueError as e:\n    print('refused:', e)\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "no layer state" in r.stdout


# --- inputs that are not what they claim ---------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["e4m3fn", "mxfp4"])
def test_sparse_tensors_are_a_type_error(backend, fmt):
    with pytest.raises(TypeError, match="dense tensor.*sparse_coo"):
        fp8lab.quantize(torch.ones(4, 64).to_sparse(), fmt, backend=backend)
    with pytest.raises(TypeError, match="dense tensor"):
        fp8lab.encode(torch.ones(4, 64).to_sparse(), fmt, backend=backend)


def test_in_place_quantization_of_a_leaf_that_requires_grad_names_the_way_out():
    x = torch.ones(64, requires_grad=True)
    with pytest.raises(ValueError, match="requires grad.*no_grad"):
        fp8lab.quantize(x, "mxfp8_e4m3", inplace=True)
    with torch.no_grad():
        fp8lab.quantize(x, "mxfp8_e4m3", inplace=True)  # as torch allows it


@pytest.mark.parametrize("axis", [5, -5, 1.5, True, 2**70, None])
@pytest.mark.parametrize("fmt", ["e4m3fn", "1.4.3"])
def test_a_wrong_axis_is_an_error_also_for_fixed_bias_formats(axis, fmt):
    # The axis means nothing to a fixed-bias format, but a wrong one was silently ignored.
    x = np.ones((4, 64), np.float32)
    with pytest.raises((TypeError, ValueError), match="axis"):
        fp8lab.quantize(x, fmt, axis=axis)
    with pytest.raises((TypeError, ValueError), match="axis"):
        fp8lab.encode(x, fmt, axis=axis)
    assert fp8lab.quantize(np.float32(2), fmt).shape == ()  # a 0-d array takes the default axis


# --- a code set whose parts do not belong together --------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ts", [float("nan"), float("inf"), -1.0, 0.0, 1e300])
def test_a_tensor_scale_that_cannot_be_one_is_refused(backend, ts):
    c = nvfp4_codes()
    c.tensor_scale = ts
    with pytest.raises(ValueError, match="tensor scale must be a positive finite"):
        fp8lab.decode(c, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_scale_given_to_a_format_without_one_is_refused(backend):
    c = fp8lab.encode(np.ones((4, 64), np.float32), "mxfp4")
    c.tensor_scale = 2.0
    with pytest.raises(ValueError, match="has no tensor scale"):
        fp8lab.decode(c, backend=backend)
    with pytest.raises(TypeError, match="tensor_scale must be a number"):
        c.tensor_scale = "x"
        fp8lab.decode(c, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt, bad", [("nvfp4", 128), ("nvfp4", 255), ("nvfp4", 2**31), ("mxfp4", 256)])
def test_scale_codes_outside_their_format_are_refused(backend, fmt, bad):
    # UE4M3 scales are 0..126 and NaN 127; E8M0's are 0..255. Others decoded to NaN silently.
    c = fp8lab.encode(np.ones((4, 64), np.float32), fmt)
    c.scales = np.full_like(c.scales, bad % 2**32)
    with pytest.raises(ValueError, match=f"scales: value {bad} at index 0 is not a"):
        fp8lab.decode(c, backend=backend)
    c.scales = np.full_like(c.scales, 127 if fmt == "nvfp4" else 255)  # the NaN code is a code
    assert np.isnan(fp8lab.decode(c, backend=backend)).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_scaled_codes_fields_are_checked(backend):
    c = nvfp4_codes()
    for axis, kind in ((5, ValueError), (-3, ValueError), (1.5, TypeError)):
        c.axis = axis
        with pytest.raises(kind, match="axis"):
            fp8lab.decode(c, backend=backend)
    c.axis = -1  # a negative axis names the same axis as encode's
    np.testing.assert_array_equal(fp8lab.decode(c, backend=backend), fp8lab.decode(nvfp4_codes(), backend=backend))
    c.format = "nvfp4"  # a scaled format's name is a scaled format
    np.testing.assert_array_equal(fp8lab.decode(c, backend=backend), fp8lab.decode(nvfp4_codes(), backend=backend))
    for f in (fp8lab.Format("e4m3fn"), 5):
        c.format = f
        with pytest.raises((TypeError, ValueError), match="format"):
            fp8lab.decode(c, backend=backend)
        with pytest.raises((TypeError, ValueError), match="format"):
            c.to_torch()


def test_a_0d_float4_tensor_is_one_row_of_two_codes():
    t = torch.zeros((), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    codes, f = fp8lab.from_torch(t)
    assert codes.shape == (2,) and str(f) == str(fp8lab.Format("e2m1fn"))
    assert fp8lab.decode(t).shape == (2,)


# --- paths and text that become something else -----------------------------------------------

def test_paths_with_a_nul_are_refused(tmp_path):
    # C's file functions end a path at its NUL: plot_lines wrote tmp/p.svg for "tmp/p\0evil".
    with pytest.raises(ValueError, match="NUL"):
        fp8lab.plot_lines(str(tmp_path / "p") + "\0evil", {"a": ([0, 1], [0, 1])})
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="NUL"):
        fp8lab.bible_verses(dir=str(tmp_path) + "\0x")
    with pytest.raises(ValueError, match="NUL"):
        ft.RunRecorder(str(tmp_path / "r.db") + "\0x", "n")
    with pytest.raises(TypeError, match="path"):
        fp8lab.plot_lines(5, {"a": ([0, 1], [0, 1])})


def test_plot_lines_checks_its_series(tmp_path):
    with pytest.raises(TypeError, match="mapping"):
        fp8lab.plot_lines(tmp_path / "p", [1, 2])
    with pytest.raises(TypeError, match="label must be a str"):
        fp8lab.plot_lines(tmp_path / "p", {5: ([0, 1], [0, 1])})
    with pytest.raises(TypeError, match="must be numbers"):
        fp8lab.plot_lines(tmp_path / "p", {"a": (["x"], [1])})
    with pytest.raises(TypeError, match="title must be a str"):
        fp8lab.plot_lines(tmp_path / "p", {"a": ([0, 1], [0, 1])}, title=5)
    with pytest.raises(ValueError, match="2 x and 1 y"):
        fp8lab.plot_lines(tmp_path / "p", {"a": ([0, 1], [1])})
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("y", [[1.0, math.nextafter(1.0, 2.0)], [1e15, 1e15 + 0.125], [-1.7e308, 1.7e308],
                               [float("nan"), float("inf")], [5e-324, 1e-323]])
def test_plot_lines_draws_any_values_in_bounded_time(tmp_path, y):
    # Values one ulp apart made the tick loop spin forever, filling memory.
    start = time.monotonic()
    fp8lab.plot_lines(tmp_path / "p", {"<a>\x01": ([0, 1], y)}, title="t\x00")
    assert time.monotonic() - start < 30
    svg = (tmp_path / "p.svg").read_bytes()
    assert b"\x00" not in svg and b"\x01" not in svg and b"&lt;a&gt;" in svg
    assert (tmp_path / "p.png").stat().st_size > 0


def test_run_recorder_checks_what_it_stores(tmp_path, cli):
    db = str(tmp_path / "r.db")
    for name in ("", "a\nb", "a\x00b"):
        with pytest.raises(ValueError, match="control characters"):
            ft.RunRecorder(db, name)
    with pytest.raises(TypeError, match="name must be a str"):
        ft.RunRecorder(db, 5)
    for seed in (-1, 2**64, 1.5):
        with pytest.raises(ValueError, match="seed"):
            ft.RunRecorder(db, "n", seed=seed)
    with pytest.raises(TypeError, match="LossScaler"):
        ft.RunRecorder(db, "n", scaler=5)
    run = ft.RunRecorder(db, "n")
    with pytest.raises(ValueError, match="loss is nan at step 3.*diverged"):
        run.log(3, loss=float("nan"))  # was SQLite's "NOT NULL constraint failed"
    for step in (-1, 2**70, "3"):
        with pytest.raises(ValueError, match="step"):
            run.log(step, loss=1.0)
    run.log(0, loss=1.0)
    run.finish()
    listed = cli("runs", "--db", db, "--csv").splitlines()
    assert len(listed) == 2 and ",n," in listed[1] and ",finished," in listed[1], listed


# --- torch's refusals on the dispatch path --------------------------------------------------

@pytest.mark.parametrize("call", [
    "torch.tensordot(torch.randn(3, 4), torch.randn(4, 5), dims=5)",
    "torch.einsum('ij,jk->ik', torch.randn(3, 4), torch.randn(5, 6))",
    "F.linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5))",
    "torch.bmm(torch.randn(2, 3, 4), torch.randn(3, 4, 5))",
    "torch.randn(2, 3, 4) @ torch.randn(3, 4, 5)",
    "F.conv2d(torch.randn(1, 3, 2, 2), torch.randn(4, 3, 3, 3))",
    "F.conv_transpose2d(torch.randn(1, 3, 4, 4), torch.randn(3, 4, 3, 3), stride=2, output_padding=3)",
])
def test_products_torch_refuses_are_value_errors_naming_the_module(call):
    # Plain torch refuses each of these; under quantized() they gave IndexError, or
    # RuntimeErrors of fp8lab's own reshapes ("shape '[1, 3, 5]' is invalid").
    with pytest.raises(Exception) as plain:
        eval(call)
    m = nn.Linear(8, 8)
    with ft.quantized(m, "mxfp8"), pytest.raises(ValueError) as quantized:
        m(torch.randn(2, 8))
        eval(call)
    text = str(quantized.value)
    assert "fp8lab" in text or "quant_" in text, text
    assert not isinstance(quantized.value, (IndexError, KeyError))
    del plain


def test_functional_shapes_are_checked_before_the_product():
    lay = ft.layer("l", a="mxfp8_e4m3", w="mxfp8_e4m3")
    with pytest.raises(ValueError, match="bias of shape \\[3\\] for 4 outputs"):
        ft.linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(3), lay)
    with pytest.raises(ValueError, match="shapes \\[2, 3, 8\\] and \\[4, 8, 4\\] do not multiply"):
        ft.matmul(torch.randn(2, 3, 8), torch.randn(4, 8, 4), lay)
    with pytest.raises(ValueError, match="give no output for a kernel spanning 3"):
        ft.conv2d(torch.randn(1, 3, 2, 2), torch.randn(4, 3, 3, 3), None, lay)
    with pytest.raises(ValueError, match="dilation"):
        ft.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), None, lay, dilation=2**31)
    with pytest.raises(ValueError, match="output_padding 5"):
        ft.conv(torch.randn(1, 3, 8), torch.randn(3, 4, 3), None, lay, transposed=True, output_padding=5)
    with pytest.raises(ValueError, match="bias of shape \\[3\\] for 8 outputs"):
        ft.conv(torch.randn(1, 3, 8), torch.randn(3, 8, 3), torch.randn(3), lay, transposed=True)
    y = ft.conv(torch.randn(1, 3, 8), torch.randn(3, 4, 3), torch.randn(4), lay, transposed=True, stride=2,
                output_padding=1)  # what torch accepts still runs
    assert y.shape == F.conv_transpose1d(torch.randn(1, 3, 8), torch.randn(3, 4, 3), stride=2,
                                         output_padding=1).shape


def test_misuse_of_state_is_both_a_runtime_and_a_value_error():
    m = nn.Linear(8, 8)
    s = ft.quantized(m, "mxfp8")
    with s:
        for kind in (RuntimeError, ValueError):
            with pytest.raises(kind, match="entered already"):
                with s:
                    pass
    scaler = ft.LossScaler("backoff")
    for kind in (RuntimeError, ValueError):
        with pytest.raises(kind, match="update\\(\\) without step"):
            scaler.update()
