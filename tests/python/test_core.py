"""fp8lab's formats, quantize/encode/decode and analysis from Python.

The values are checked against references that do not share fp8lab's code where one
exists (a format's values built from its bit fields in NumPy, NumPy's float16, closed forms
of the figures, the paper's Appendix A numbers), and against the C++ kernels as the
`fp8lab quantize` command runs them (stochastic rounding, scaled formats).
"""
import pickle
import threading
import time

import numpy as np

import pytest
import torch

import fp8lab

# Signed, codable formats with subnormals: the reference below builds their values.
REFERENCE_FORMATS = [
    ("e4m3fnuz", 4, 3, 8, "fnuz"), ("e4m3b11fnuz", 4, 3, 11, "fnuz"), ("e5m2fnuz", 5, 2, 16, "fnuz"),
    ("e4m3fn", 4, 3, 7, "fn"), ("e5m2", 5, 2, 15, "ieee"), ("e3m4", 3, 4, 3, "ieee"),
    ("e2m3fn", 2, 3, 1, "finite"), ("e3m2fn", 3, 2, 3, "finite"), ("e2m1fn", 2, 1, 1, "finite"),
    ("1.5.2", 5, 2, 15, "fnuz"), ("1.4.3", 4, 3, 7, "fnuz"), ("1.3.4", 3, 4, 3, "fnuz"),
    ("1.4.3:10", 4, 3, 10, "fnuz"), ("1.5.2:24", 5, 2, 24, "fnuz"), ("1.0.7:-2", 0, 7, -2, "fnuz"),
    ("1.2.5:0", 2, 5, 0, "fnuz"), ("fp16", 5, 10, 15, "ieee"),
]


def reference_magnitudes(E, M, bias, policy):
    """The finite non-negative values of a 1.E.M format and whether each one's code is even,
    from the bit fields alone (docs/spec.md §1)."""
    vals, even = [], []
    for e in range(2 ** E):
        for m in range(2 ** M):
            if policy == "ieee" and E > 0 and e == 2 ** E - 1:
                continue  # Inf and NaN
            if policy == "fn" and e == 2 ** E - 1 and m == 2 ** M - 1:
                continue  # the NaN code
            v = 2.0 ** (1 - bias) * m / 2 ** M if e == 0 else 2.0 ** (e - bias) * (1 + m / 2 ** M)
            vals.append(v)
            even.append(m % 2 == 0)
    order = np.argsort(vals, kind="stable")
    return np.asarray(vals)[order], np.asarray(even)[order]


def reference_quantize(x, E, M, bias, policy, rounding):
    mags, even = reference_magnitudes(E, M, bias, policy)
    ax = np.abs(x.astype(np.float64))
    lo = np.clip(np.searchsorted(mags, ax, side="right") - 1, 0, len(mags) - 1)
    hi = np.minimum(lo + 1, len(mags) - 1)
    if rounding == "toward-zero":
        r = mags[lo]
    else:
        dlo, dhi = ax - mags[lo], mags[hi] - ax
        tie_up = ~even[lo] if rounding == "nearest-even" else np.ones_like(even[lo])  # nearest-away: every tie up
        up = (dhi < dlo) | ((dhi == dlo) & (even[hi] | (rounding == "nearest-away")) & tie_up)
        r = np.where(up, mags[hi], mags[lo])
    r = np.minimum(r, mags[-1])  # saturate
    signed = np.copysign(r, x) if policy != "fnuz" else np.where(r == 0, 0.0, np.copysign(r, x))
    return signed.astype(np.float32)


def sample_values(rng, E, M, bias, policy):
    """Values over the whole range: subnormals, normals, beyond max, exact ties, zeros."""
    mags, _ = reference_magnitudes(E, M, bias, policy)
    top = mags[-1]
    x = np.concatenate([
        rng.standard_normal(20000) * top / 4,
        np.exp2(rng.uniform(np.log2(mags[1]) - 3, np.log2(top) + 2, 20000)) * rng.choice([-1, 1], 20000),
        (mags[:-1] + mags[1:]) / 2,  # every tie
        -(mags[:-1] + mags[1:]) / 2,
        mags, -mags, [0.0, -0.0, top * 4, -top * 4],
    ])
    return x.astype(np.float32)


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name,E,M,bias,policy", REFERENCE_FORMATS)
@pytest.mark.parametrize("rounding", ["nearest-even", "toward-zero", "nearest-away"])
def test_quantize_equals_the_bitfield_reference(rng, name, E, M, bias, policy, rounding):
    x = sample_values(rng, E, M, bias, policy)
    want = reference_quantize(x, E, M, bias, policy, rounding)
    got = fp8lab.quantize(x, name, rounding=rounding)
    np.testing.assert_array_equal(bits(got), bits(want))
    # The same through torch, and in place.
    t = torch.from_numpy(x.copy())
    np.testing.assert_array_equal(bits(fp8lab.quantize(t, name, rounding=rounding).numpy()), bits(want))
    fp8lab.quantize(t, name, rounding=rounding, inplace=True)
    np.testing.assert_array_equal(bits(t.numpy()), bits(want))


def test_fp16_equals_numpy_float16(rng):
    x = (rng.standard_normal(100000) * 1000).astype(np.float32)
    np.testing.assert_array_equal(fp8lab.quantize(x, "fp16"), x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("name,E,M,bias,policy", REFERENCE_FORMATS)
def test_format_figures_are_the_closed_forms(name, E, M, bias, policy):
    f = fp8lab.Format(name)
    mags, _ = reference_magnitudes(E, M, bias, policy)
    assert (f.exp_bits, f.man_bits, f.bias, f.policy) == (E, M, bias, policy)
    assert f.max == mags[-1]
    assert f.min_subnormal == mags[1]
    assert f.dynamic_range_db == pytest.approx(20 * np.log10(mags[-1] / mags[1]), rel=1e-12)
    assert f.snr_db == pytest.approx(7.44 + 6.02 * (M + 1))
    if E > 0:
        assert f.min_normal == 2.0 ** (1 - bias)
    assert fp8lab.Format(exp_bits=E, man_bits=M, bias=bias, policy=policy) == f


def test_format_values_are_every_code():
    f = fp8lab.Format("e4m3fn")
    v = f.values().numpy()
    assert v.shape == (256,)
    assert np.isnan(v[0x7F]) and np.isnan(v[0xFF]) and v[0x7E] == 448 and v[0x01] == 2.0 ** -9


def test_formats_table_is_table_1(cli):
    rows = fp8lab.formats()
    assert [r["name"] for r in rows] == ["fp32", "fp16", "bf16", "dlfloat16", "1.5.2", "1.4.3", "1.3.4"]
    csv = cli("formats", "--csv").strip().splitlines()
    header = csv[0].split(",")
    for line, row in zip(csv[1:], rows):
        cells = dict(zip(header, line.split(",")))
        assert cells["format"] == row["format"]
        assert float(cells["max"]) == pytest.approx(row["max"], rel=1e-7)
        assert float(cells["dynamic_range_db"]) == pytest.approx(row["dynamic_range_db"], abs=0.05)
    assert {p["name"] for p in fp8lab.presets()} >= {"e4m3fn", "e5m2", "e4m3fnuz", "fp16", "bf16"}
    assert {p["name"] for p in fp8lab.scaled_presets()} >= {"mxfp4", "nvfp4", "mxfp8_e4m3"}
    assert {p["name"] for p in fp8lab.recipe_presets()} >= {"fp32", "resnet32-152"}


CODABLE_PRESETS = [p["name"] for p in fp8lab.presets() if fp8lab.Format(p["name"]).bits <= 16]


@pytest.mark.parametrize("name", CODABLE_PRESETS)
@pytest.mark.parametrize("rounding", ["nearest-even", "toward-zero", "stochastic"])
def test_every_preset_and_rounding_equals_the_cli(cli, tmp_path, rng, name, rounding):
    f = fp8lab.Format(name)
    x = (rng.standard_normal((37, 53)) * f.max / 8).astype(np.float32)
    big = min(f.max * 3, 3e38)
    x[0, :5] = [0.0, big, -big, f.min_subnormal / 3, np.nan]
    np.save(tmp_path / "x.npy", x)
    cli("quantize", tmp_path / "x.npy", tmp_path / "y.npy", "-f", name, "-r", rounding, "--seed", 7, "-q")
    cli("quantize", tmp_path / "x.npy", tmp_path / "c.npy", "-f", name, "-r", rounding, "--seed", 7, "--codes", "-q")
    y, counts = fp8lab.quantize(x, name, rounding=rounding, seed=7, return_counts=True)
    np.testing.assert_array_equal(bits(y), bits(np.load(tmp_path / "y.npy")))
    codes = fp8lab.encode(x, name, rounding=rounding, seed=7)
    np.testing.assert_array_equal(codes, np.load(tmp_path / "c.npy"))
    decoded = fp8lab.decode(codes, name)
    if not f.has_nan:  # a NaN is stored as +0 in a format without NaN (quantize keeps it NaN)
        y = np.where(np.isnan(x), np.float32(0), y)
    np.testing.assert_array_equal(bits(decoded), bits(y))
    assert counts["total"] == x.size
    assert counts["nan"] == 1 if f.signed else counts["nan"] > 1  # unsigned: negatives are NaN


def test_stochastic_rounding_does_not_depend_on_layout(rng):
    x = rng.standard_normal((64, 96)).astype(np.float32)
    c = fp8lab.quantize(x, "1.5.2", rounding="stochastic", seed=3)
    f = fp8lab.quantize(np.asfortranarray(x), "1.5.2", rounding="stochastic", seed=3)
    np.testing.assert_array_equal(c, f)
    t = torch.from_numpy(x.T.copy()).T  # a transposed view
    np.testing.assert_array_equal(fp8lab.quantize(t, "1.5.2", rounding="stochastic", seed=3).numpy(), c)
    assert not np.array_equal(fp8lab.quantize(x, "1.5.2", rounding="stochastic", seed=4), c)
    # Unbiased: the mean of many draws approaches x.
    draws = np.mean([fp8lab.quantize(x[:4], "1.5.2", rounding="stochastic", seed=s) for s in range(2000)], axis=0)
    np.testing.assert_allclose(draws, x[:4], atol=0.02 * np.abs(x[:4]).max())


def test_in_place_through_strided_views(rng):
    x = rng.standard_normal((8, 10)).astype(np.float32)
    want = fp8lab.quantize(x, "1.4.3", rounding="stochastic", seed=1)
    a = x.copy()
    fp8lab.quantize(a, "1.4.3", rounding="stochastic", seed=1, inplace=True)
    np.testing.assert_array_equal(a, want)
    t = torch.from_numpy(x.T.copy())
    view = t.T  # not contiguous
    out = fp8lab.quantize(view, "1.4.3", rounding="stochastic", seed=1, inplace=True)
    assert out is view
    np.testing.assert_array_equal(view.numpy(), want)
    big = torch.from_numpy(x.copy())
    cols = big[:, ::2]
    fp8lab.quantize(cols, "1.4.3", inplace=True)
    np.testing.assert_array_equal(big[:, 1::2].numpy(), x[:, 1::2])  # untouched
    np.testing.assert_array_equal(big[:, ::2].numpy(), fp8lab.quantize(np.ascontiguousarray(x[:, ::2]), "1.4.3"))


@pytest.mark.parametrize("fmt", ["1.4.3", "e5m2", "mxfp4", "nvfp4"])
def test_empty_and_zero_dimensional_inputs(fmt):
    for shape in [(0,), (0, 5), (5, 0), (3, 0, 2)]:
        x = np.zeros(shape, np.float32)
        assert fp8lab.quantize(x, fmt).shape == shape
        enc = fp8lab.encode(x, fmt)
        assert fp8lab.decode(enc, None if hasattr(enc, "scales") else fmt).shape == shape
    if fmt in ("1.4.3", "e5m2"):
        assert fp8lab.quantize(np.array(3.3, np.float32), fmt).shape == ()
        assert float(fp8lab.quantize(np.float32(3.3), fmt)) == float(fp8lab.quantize(np.float32([3.3]), fmt)[0])
    else:
        with pytest.raises(ValueError, match="dimension"):
            fp8lab.quantize(np.array(3.3, np.float32), fmt)


def test_wide_codes_are_uint16(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    c = fp8lab.encode(x, "fp16")
    assert c.dtype == np.uint16
    np.testing.assert_array_equal(c, x.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(fp8lab.decode(c, "fp16"), x.astype(np.float16).astype(np.float32))
    t = fp8lab.encode(torch.from_numpy(x), "fp16")
    assert t.dtype == torch.int16


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3", "nvfp4", "deepseek_1x128", "e4m3_tensor",
                                 "e4m3fn@1x16:e8m0:ceil"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_scaled_formats_equal_the_cli(cli, tmp_path, rng, fmt, axis):
    x = (rng.standard_normal((24, 160)) * np.exp2(rng.integers(-8, 8, (24, 1)))).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    cli("quantize", tmp_path / "x.npy", tmp_path / "y.npy", "-f", fmt, "--axis", axis, "-q")
    y = fp8lab.quantize(x, fmt, axis=axis)
    np.testing.assert_array_equal(bits(y), bits(np.load(tmp_path / "y.npy")))
    enc = fp8lab.encode(x, fmt, axis=axis)
    np.testing.assert_array_equal(bits(fp8lab.decode(enc)), bits(y))
    t = fp8lab.quantize(torch.from_numpy(x), fmt, axis=axis)
    np.testing.assert_array_equal(bits(t.numpy()), bits(y))


def test_exponent_histogram_counts_floor_log2(rng):
    x = (rng.standard_normal(50000) * np.exp2(rng.integers(-30, 30, 50000))).astype(np.float32)
    x[:10] = 0
    x[10] = np.inf
    x[11] = np.nan
    h = fp8lab.exponent_histogram(x)
    finite = x[np.isfinite(x) & (x != 0)]
    e = np.frexp(finite)[1] - 1  # floor(log2|x|)
    want = np.bincount(e - e.min())
    assert h["lo"] == e.min()
    np.testing.assert_array_equal(h["counts"], want)
    assert (h["zero"], h["inf"], h["nan"]) == (10, 1, 1)


def test_appendix_a_snr():
    # The paper's Appendix A: the scaled integer 1.0.7 on a standard normal signal.
    for fmt, db in [("1.0.7:-2", 34.9), ("1.0.7:-1", 40.5), ("1.0.7:0", 19.2)]:
        assert fp8lab.snr_model_db(fmt) == pytest.approx(db, abs=0.05)
        x = fp8lab.sample("normal", 200000, seed=1)
        assert fp8lab.measured_snr_db(x, fmt) == pytest.approx(db, abs=0.3)
    assert fp8lab.snr_model_db("1.4.3") == pytest.approx(31.52)
    assert fp8lab.dynamic_range_db("1.5.2") == pytest.approx(20 * np.log10(114688 * 2.0 ** 16), rel=1e-12)
    x = fp8lab.sample("student-t:3", 100000, seed=2)
    assert fp8lab.measured_snr_db(x, "mxfp4") > fp8lab.measured_snr_db(x, "e2m1fn")


def test_errors_are_python_exceptions():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="1.9.9"):
        fp8lab.Format("1.9.9")
    with pytest.raises(ValueError, match="rounding"):
        fp8lab.quantize(x, "1.4.3", rounding="upward")
    with pytest.raises(ValueError):
        fp8lab.quantize(x, "e4m3fn", overflow="inf")  # no Inf in e4m3fn
    with pytest.raises(TypeError, match="float32"):
        fp8lab.quantize(x.astype(np.float64), "1.4.3")
    with pytest.raises(TypeError, match="float32"):
        fp8lab.quantize(torch.ones(3, dtype=torch.float16), "1.4.3")
    with pytest.raises(TypeError, match="meta device holds no values"):
        fp8lab.quantize(torch.empty(3, device="meta"), "1.4.3")
    with pytest.raises(TypeError, match="CPU"):
        fp8lab.quantize(torch.empty(3, device="meta"), "1.4.3", backend="kernels")
    with pytest.raises(TypeError, match="NumPy array or a torch tensor"):
        fp8lab.quantize([1.0, 2.0], "1.4.3")
    with pytest.raises(TypeError, match="uint8"):
        fp8lab.decode(np.zeros(3, np.int32), "1.4.3")
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        fp8lab.quantize(ro, "1.4.3", inplace=True)
    np.testing.assert_array_equal(fp8lab.quantize(ro, "1.4.3"), ro)
    with pytest.raises(ValueError, match="axis"):
        fp8lab.quantize(x, "mxfp4", axis=2)
    with pytest.raises(ValueError):
        fp8lab.quantize(x, "1.4.3", random_bits=0)
    with pytest.raises(ValueError, match="share memory"):
        fp8lab.quantize(torch.ones(1).expand(8), "1.4.3", inplace=True)
    with pytest.raises(TypeError, match="rounding must be a name"):
        fp8lab.quantize(x, "1.4.3", rounding=3)
    with pytest.raises(ValueError, match="seed must be in 0..2\\^64-1"):
        fp8lab.encode(x, "1.4.3", rounding="stochastic", seed=-1)
    with pytest.raises(ValueError, match="seed must be in"):
        fp8lab.quantize(x, "1.4.3", rounding="stochastic", seed=2**70)
    with pytest.raises(TypeError, match="axis must be an integer"):
        fp8lab.quantize(np.ones((2, 32), np.float32), "mxfp4", axis=1.5)
    with pytest.raises(ValueError, match="n must be >= 0"):
        fp8lab.sample("normal", -1)
    with pytest.raises(ValueError, match="at most 1073741824"):  # refused, never allocated
        fp8lab.sample("normal", 10**15)
    with pytest.raises(ValueError, match=r"outside \[1e-30, 1e30\]"):  # float32 samples would be Inf
        fp8lab.sample("normal", 10, scale=1e300)


def test_kernels_release_the_gil():
    x = np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32)
    calls = []

    def work():
        for _ in range(4):
            t0 = time.perf_counter()
            fp8lab.quantize(x, "1.4.3", rounding="stochastic")
            calls.append((t0, time.perf_counter()))
    stamps = []
    worker = threading.Thread(target=work)
    worker.start()
    while worker.is_alive():
        stamps.append(time.perf_counter())
        time.sleep(0.001)
    worker.join()
    # With the GIL held through a call, this thread could stamp at most once inside it (in the
    # interpreter's switch before the call starts). Counted, not timed: a machine busy with
    # other work delays this thread without stopping it for a whole call.
    inside = [sum(t0 < t < t1 for t in stamps) for t0, t1 in calls]
    assert sum(n >= 2 for n in inside) >= 3, (inside, [t1 - t0 for t0, t1 in calls])


def test_a_recipe_from_fields_is_the_recipe_of_its_line():
    # One grammar (docs/spec.md §4.2): keyword fields, the line and the TOML say the same.
    fields = fp8lab.Recipe(a="1.4.3:10", w="1.4.3:14", gx="1.5.2:33/stochastic:12", gw="fp32",
                           exempt_first="fp16", keep_last=True, hadamard=16, compute="auto",
                           accumulate="e5m2@32")
    line = fp8lab.Recipe("a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33/stochastic:12,first=fp16,last=fp32,"
                         "hadamard=16,compute=auto,accumulate=e5m2@32")
    assert fields.to_line() == line.to_line()
    assert (fields.compute, fields.accumulate, fields.hadamard) == ("auto", "1.5.2:ieee@32", 16)
    assert fp8lab.Recipe("fp32").compute is None  # left to the run
    with_overrides = fp8lab.Recipe(a="1.4.3", overrides=[{"match": "fc*", "a": "fp32"}])
    assert with_overrides.resolve("fc1", 1, 3)["a"] == "fp32"
    assert with_overrides.resolve("conv", 1, 3)["a"] != "fp32"
    with pytest.raises(ValueError, match="only its TOML form"):
        with_overrides.to_line()
    assert "[[override]]" in with_overrides.to_toml()
    with pytest.raises(ValueError, match="recipe field 'gx'"):
        fp8lab.Recipe(gx="1.9.9")
    with pytest.raises(ValueError, match="unknown field 'bogus'"):
        fp8lab.Recipe(a="1.4.3", bogus=1)
    with pytest.raises(ValueError, match="not both"):
        fp8lab.Recipe("fp32", a="1.4.3")
    with pytest.raises(TypeError, match="gx must be a str"):
        fp8lab.Recipe(gx=1.5)


def test_the_nvfp4_training_recipe_and_its_switches():
    # NVIDIA's NVFP4 recipe as one preset; each of its parts a key, as fields or after the name.
    full = fp8lab.Recipe("nvfp4-training")
    assert full.base["w"] == "e2m1fn@16x16:ue4m3:nearest:tensor-scale"
    assert full.base["gx"] == "e2m1fn@1x16:ue4m3:nearest:tensor-scale/stochastic"
    bf16 = fp8lab.Recipe("a=bf16").base["a"]
    assert (full.hadamard, full.hadamard_signs, full.keep_first_quant, full.keep_last_quant) == (16, "random", bf16, bf16)
    assert all(full.resolve("x", i, 3)[k] == bf16 for i in (0, 2) for k in "a w gx gw".split())
    switched = fp8lab.Recipe("nvfp4-training,hadamard_signs=none,w=nvfp4")
    assert switched.hadamard_signs == "none" and switched.base["w"] == fp8lab.Recipe("a=nvfp4").base["a"]
    assert switched.resolve("x", 1, 3).hadamard_signs == "none"
    fields = fp8lab.Recipe(a="nvfp4", w="nvfp4", gx="nvfp4/stochastic", keep_first="bf16", keep_last="bf16",
                           hadamard=16, hadamard_signs="none")
    assert fields.to_line() == switched.to_line()
    # Every size, on both backward products (docs/spec.md §6.6), as fields or a line.
    both = fp8lab.Recipe(a="mxfp4", w="mxfp4", gx="mxfp4/stochastic", hadamard=64, hadamard_on="backward")
    assert (both.hadamard, both.hadamard_on) == (64, "backward")
    layer = both.resolve("fc", 0, 1)
    assert (layer.hadamard, layer.hadamard_on) == (64, "backward")
    assert pickle.loads(pickle.dumps(layer)) == layer
    assert fp8lab.Recipe(both.to_line()).hadamard_on == "backward"
    # Backward forms (docs/spec.md §6.12): a field, a layer's property, pickled with it.
    tseng = fp8lab.Recipe("mxfp4-tseng")
    middle = tseng.resolve("fc", 1, 3)
    assert middle.a_bwd == middle.w_bwd == middle["gx"] == "e2m1fn@1x32:e8m0:floor:dither-scale/stochastic"
    assert (middle["a"], tseng.resolve("fc", 0, 3).a_bwd) == (bf16, "fp32")
    assert pickle.loads(pickle.dumps(middle)) == middle and middle.bwd_from == "tensor"
    requantized = fp8lab.Recipe(a="nvfp4", a_bwd="mxfp4", bwd_from="forward").resolve("fc", 1, 3)
    assert requantized.bwd_from == "forward" and pickle.loads(pickle.dumps(requantized)) == requantized
    assert fp8lab.Recipe(a="bf16", a_bwd="mxfp4").base.a_bwd == fp8lab.Recipe("a=mxfp4").base["a"]
    with pytest.raises(ValueError, match="a_bwd'?: '1.4.3' is not a scaled quantizer"):
        fp8lab.Recipe(a="bf16", a_bwd="1.4.3")
    with pytest.raises(ValueError, match="16 fixed signs"):
        fp8lab.Recipe(a="nvfp4", hadamard=128, hadamard_signs="te")


def test_a_recipe_reads_back_from_its_toml(tmp_path):
    r = fp8lab.Recipe(name="mine", a="mxfp8_e4m3", gx="nvfp4/stochastic", keep_last=True,
                      overrides=[{"match": "first", "w": "fp16"}])
    path = tmp_path / "mine.toml"
    path.write_text(r.to_toml())
    assert fp8lab.Recipe(str(path)) == r
