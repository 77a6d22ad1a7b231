"""fp8lab's MX quantizers against torchao's (torchao.prototype.mx_formats.to_mx, a test
dependency), its `torchao` NVFP4 variant against torchao's nvfp4_quantize, and its NVFP4
quantizer against TransformerEngine's documented reference algorithm, block by block
(docs/spec.md §6.9). MX: fp8lab's `floor` scales are torchao's FLOOR, its `ceil` scales
torchao's RCEIL, bit for bit, for every element format, wherever a block's largest magnitude
is a finite normal float32; the two conventions that differ are pinned, with fp8lab's side
checked against ml_dtypes. NVFP4: `nvfp4:torchao` (and its one-level form) gives torchao's
codes, scales and values bit for bit on every finite block; blocks holding a NaN or an
infinity are pinned."""
import ml_dtypes
import numpy as np
import pytest
import torch
from torchao.prototype.custom_fp_utils import _floatx_unpacked_to_f32
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
from torchao.prototype.mx_formats.kernels import unpack_uint4
from torchao.prototype.mx_formats.mx_tensor import get_fp_scale, to_mx
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

import fp8lab

# (fp8lab element, torchao element dtype, its (ebits, mbits) where torchao returns raw codes)
ELEMENTS = [("e4m3fn", torch.float8_e4m3fn, None), ("e5m2", torch.float8_e5m2, None),
            ("e2m1fn", torch.float4_e2m1fn_x2, (2, 1)), ("e2m3fn", DTYPE_FP6_E2M3, (2, 3)),
            ("e3m2fn", DTYPE_FP6_E3M2, (3, 2))]
# fp8lab's scale rule and the torchao modes that agree with it
# (torchao's CEIL, 2^(ceil(log2 amax) - emax), and EVEN, amax rounded to the element's
# precision first, are rules fp8lab does not have.)
RULES = [("floor", [ScaleCalculationMode.FLOOR]), ("ceil", [ScaleCalculationMode.RCEIL])]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values and zero signs, NaN where the other is NaN."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32))


def torchao_values(x: torch.Tensor, dtype, bits, mode) -> torch.Tensor:
    scales, data = to_mx(x.contiguous(), dtype, 32, mode)
    if dtype == torch.float4_e2m1fn_x2:
        elements = _floatx_unpacked_to_f32(unpack_uint4(data.view(torch.uint8)), *bits)
    elif bits:
        elements = _floatx_unpacked_to_f32(data.view(torch.uint8), *bits)
    else:
        elements = data.float()
    per_block = elements.reshape(x.shape[0], -1, 32) * get_fp_scale(scales).reshape(x.shape[0], -1, 1)
    return per_block.reshape(x.shape)


def agreeing_blocks() -> torch.Tensor:
    """One 32-value block a row: random blocks over the normal float32 range whose scale lies
    above E8M0's least (2^-127: those differ, below), blocks
    just below and at powers of two, elements that saturate, a zero block, a NaN block, the
    largest float32 values."""
    g = torch.Generator().manual_seed(44)
    rows = [torch.randn(32, generator=g) * 2.0 ** e for e in range(-110, 121, 3)]
    for e in (-110, -100, -9, 0, 8, 15, 100, 126):
        below = torch.full((32,), 2.0 ** e)
        below[0] = torch.nextafter(torch.tensor(2.0 ** (e + 1)), torch.tensor(0.0))
        rows += [below, torch.full((32,), 2.0 ** e) * torch.sign(torch.randn(32, generator=g))]
    for m in (6.0, 6.5, 7.0, 7.5, 28.0, 30.0, 448.0, 464.0, 480.0, 57344.0, 61440.0, 3.0e38):
        b = torch.randn(32, generator=g)
        b[0] = m
        rows.append(b)
    b = torch.randn(32, generator=g)
    b[3] = float("nan")
    rows += [torch.zeros(32), -torch.zeros(32), b, torch.full((32,), 3.4e38)]
    return torch.stack(rows).float()


@pytest.mark.parametrize("rule,modes", RULES, ids=[r for r, _ in RULES])
@pytest.mark.parametrize("element,dtype,bits", ELEMENTS, ids=[e for e, _, _ in ELEMENTS])
def test_mx_blocks_are_torchaos_bit_for_bit(element, dtype, bits, rule, modes):
    x = agreeing_blocks()
    ours = fp8lab.quantize(x, f"{element}@1x32:e8m0:{rule}")
    for mode in modes:
        theirs = torchao_values(x, dtype, bits, mode)
        bad = [i for i in range(x.shape[0]) if not same(ours[i], theirs[i])]
        assert not bad, f"{element} {rule} vs {mode}: blocks {bad[:5]}, first {x[bad[0], :3].tolist()}"


def test_the_conventions_that_differ():
    """A block holding an infinity: fp8lab gives it a NaN scale and NaN elements (§6.2),
    torchao zeros beside the infinity. A block whose scale is E8M0's least, 2^-127 (its
    largest magnitude below 2^(emax - 126)): fp8lab's elements are x / 2^-127 rounded (here
    checked against ml_dtypes), torchao's x / 2^-126 rounded, read back as times 2^-127:
    half the value."""
    g = torch.Generator().manual_seed(45)
    inf = torch.randn(2, 32, generator=g)
    inf[0, 5], inf[1, 9] = float("inf"), -float("inf")
    ours = fp8lab.quantize(inf, "e4m3fn@1x32:e8m0:floor")
    theirs = torchao_values(inf, torch.float8_e4m3fn, None, ScaleCalculationMode.FLOOR)
    assert torch.isnan(ours).all()
    assert torch.equal(theirs, torch.where(torch.isinf(inf), inf, 0.0).abs() * torch.sign(theirs).abs().clamp(min=1)
                       * torch.where(torch.isinf(inf), torch.sign(inf), 1.0))  # the infinity stays, the rest 0

    # amax from 2^-120 down to 2^-139: floor(log2 amax) - 8 <= -127, so E8M0's least scale.
    tiny = torch.randn(5, 32, generator=g) * torch.tensor([2.0 ** -120, 2.0 ** -124, 2.0 ** -127, 2.0 ** -130,
                                                          2.0 ** -134])[:, None]
    x = tiny.double().numpy()
    code_of = lambda v: v.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    ours = fp8lab.quantize(tiny, "e4m3fn@1x32:e8m0:floor")
    assert same(ours, torch.from_numpy(code_of(x * 2.0 ** 127) * 2.0 ** -127).float())  # x / 2^-127, rounded
    theirs = torchao_values(tiny, torch.float8_e4m3fn, None, ScaleCalculationMode.FLOOR)
    # torchao divides by float32's least normal, 2^-126 (its clamp), and its code reads 2^-127.
    assert same(theirs, torch.from_numpy(code_of(x * 2.0 ** 126) * 2.0 ** -127).float())
    assert all(not same(ours[i], theirs[i]) for i in range(5))


# UE4M3's values: code c's value, for c in 0..126.
UE4M3 = fp8lab.decode(torch.arange(127, dtype=torch.uint8), "ue4m3")


def nvfp4_blocks(seed: int) -> torch.Tensor:
    """Rows of four 16-value blocks whose tensor amax is 2688 (6 * 448: the tensor scale is 1,
    so a block's scale quotient is fl32(amax_b / 6)): random blocks from 2^-40 to the tensor's
    amax (quotients from UE4M3's largest down past its least normal, 2^-6, which torchao clamps
    up to, and its subnormals), blocks whose amax_b / 6 is a UE4M3 value, a midpoint between
    two (ties to even), or one float32 step beside either, zero and negative-zero blocks, and
    blocks whose elements round to E2M1's ties."""
    g = torch.Generator().manual_seed(seed)
    blocks = [torch.randn(16, generator=g) * 2.0 ** e for e in range(-40, 10, 2)]
    values = UE4M3[1:].double()
    picks = torch.cat([values, (values[:-1] + values[1:]) / 2])
    for q in picks[torch.randperm(len(picks), generator=g)[:60]]:
        for amax in (6 * q, torch.nextafter(torch.tensor(6 * q).float(), torch.tensor(0.0)).double(),
                     torch.nextafter(torch.tensor(6 * q).float(), torch.tensor(1e9)).double()):
            if amax > 2688:
                continue
            b = torch.rand(16, generator=g) * float(amax) * torch.sign(torch.randn(16, generator=g))
            b[int(torch.randint(16, (1,), generator=g))] = float(amax)
            blocks.append(b)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -2.5, -5.0, 0.1, 4.9, 5.1, -6.0, 3.0])
    blocks += [torch.zeros(16), -torch.zeros(16), ties, ties * 0.5, ties * 1e-3]
    while len(blocks) % 4:
        blocks.append(torch.randn(16, generator=g))
    x = torch.stack(blocks).float().reshape(-1, 64)
    x[0, 0] = 2688.0
    return x


def torchao_nvfp4(x: torch.Tensor, tensor_scale):
    """torchao's element codes, scale codes and dequantized values (elements times fl32(ts * s),
    its NVFP4Tensor.dequantize) of x, with the given float32 tensor scale or none."""
    ts = None if tensor_scale is None else torch.tensor(tensor_scale, dtype=torch.float32)
    scales, packed = nvfp4_quantize(x.contiguous(), 16, ts)
    codes = unpack_uint4(packed.view(torch.uint8)).reshape(x.shape)
    elements = fp8lab.decode(codes, "e2m1fn")
    hp = scales.float() if ts is None else ts * scales.float()
    values = (elements.reshape(x.shape[0], -1, 16) * hp.unsqueeze(-1)).reshape(x.shape)
    return codes, scales.view(torch.uint8), values


def fp8lab_nvfp4(x: torch.Tensor, spec: str):
    enc = fp8lab.encode(x, spec)
    codes = torch.as_tensor(np.asarray(enc.codes)).reshape(x.shape)
    scales = torch.as_tensor(np.asarray(enc.scales).astype(np.uint8)).reshape(x.shape[0], -1)
    return codes, scales, fp8lab.quantize(x, spec), enc.tensor_scale


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale", [1.0, 2.0 ** -20, 0.1])
def test_nvfp4_torchao_is_torchaos_bit_for_bit(seed, scale):
    """`nvfp4:torchao` against torchao's two-level nvfp4_quantize with the tensor scale
    torchao's per_tensor_amax_to_scale gives (the same as fp8lab's): the same tensor scale,
    scale codes, element codes and values for every block, at three tensor magnitudes (a
    tensor scale of 1, a power of two, and one that rounds)."""
    x = nvfp4_blocks(seed) * scale
    codes, scales, values, ts = fp8lab_nvfp4(x, "nvfp4:torchao")
    assert ts == per_tensor_amax_to_scale(x.abs().max()).item()
    want_codes, want_scales, want_values = torchao_nvfp4(x, ts)
    assert torch.equal(scales, want_scales), f"{(scales != want_scales).sum().item()} scales differ"
    assert torch.equal(codes, want_codes), f"{(codes != want_codes).sum().item()} codes differ"
    assert same(values, want_values)
    # And the exact order differs from it on these blocks (the variant is not the default).
    assert not torch.equal(fp8lab_nvfp4(x, "nvfp4")[0], want_codes)


@pytest.mark.parametrize("tensor_amax", [268.8, 2688.0 * 3, 1e-3])
def test_nvfp4_torchao_elements_at_e2m1_midpoints(tensor_amax):
    """Elements that lie exactly at E2M1's rounding midpoints times their block's X = fl32(s *
    ts), for every normal UE4M3 scale s, under tensor scales that round: torchao multiplies by
    fl32(fl32(1 / ts) / s), which lands a float32 step above or below the midpoint, where
    fl32(x / X) is the midpoint itself (a tie) and fl32(x / X) by fl32(1 / X) is a third
    answer. `nvfp4:torchao` gives torchao's codes for all of them."""
    ts = np.float32(np.float32(tensor_amax) / np.float32(2688))
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 0.5],
                    dtype=np.float32)
    rows = []
    for s in UE4M3[8:].numpy().astype(np.float32):
        X = np.float32(s * ts)
        rows.append(np.concatenate([[np.float32(6) * X], mids * X]).astype(np.float32))
    x = torch.from_numpy(np.stack(rows))
    x = torch.cat([x, torch.zeros(1, 16)]).reshape(-1, 16)
    x[-1, 0] = float(np.float32(tensor_amax))
    codes, scales, values, got_ts = fp8lab_nvfp4(x, "nvfp4:torchao")
    want_codes, want_scales, want_values = torchao_nvfp4(x, got_ts)
    assert got_ts == ts
    assert torch.equal(scales, want_scales), f"{(scales != want_scales).sum().item()} scales differ"
    assert torch.equal(codes, want_codes), f"{(codes != want_codes).sum().item()} codes differ"
    assert same(values, want_values)
    assert not torch.equal(fp8lab_nvfp4(x, "nvfp4")[0], want_codes)


@pytest.mark.parametrize("seed", [3, 4])
def test_one_level_torchao_is_torchaos_bit_for_bit(seed):
    """Without a tensor scale (`e2m1fn@1x16:ue4m3:nearest:torchao`) against torchao's one-level
    nvfp4_quantize, on blocks from far below UE4M3's least normal scale to past its largest
    (amax_b above 6 * 448 = 2688: the scale is clamped to 448 and the elements saturate)."""
    x = torch.cat([nvfp4_blocks(seed), nvfp4_blocks(seed + 10) * 2.0 ** 7])
    codes, scales, values, ts = fp8lab_nvfp4(x, "e2m1fn@1x16:ue4m3:nearest:torchao")
    assert ts == 1.0
    want_codes, want_scales, want_values = torchao_nvfp4(x, None)
    assert torch.equal(scales, want_scales), f"{(scales != want_scales).sum().item()} scales differ"
    assert torch.equal(codes, want_codes), f"{(codes != want_codes).sum().item()} codes differ"
    assert same(values, want_values)
    enc, counts = fp8lab.encode(x, "e2m1fn@1x16:ue4m3:nearest:torchao", return_counts=True)
    assert counts["scale_overflow"] > 0 and counts["scale_underflow"] > 0


def test_nvfp4_torchao_blocks_with_nan_or_infinity():
    """Where they differ: a block holding a NaN has the NaN scale (0x7f) in both, but torchao's
    element codes there are whatever its conversion makes of NaN (E2M1 has no NaN), fp8lab's
    0, read back as NaN through the scale. A block holding an infinity: fp8lab gives it a NaN
    scale and NaN values (§6.2); torchao clamps the scale to 448 and the infinity to 6."""
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(5))
    x[0, 3] = float("nan")
    x[1, 20] = float("inf")
    ts = float(np.float32(torch.where(torch.isfinite(x), x.abs(), 0).max().item() / 2688.0))
    codes, scales, values, got_ts = fp8lab_nvfp4(x, "nvfp4:torchao")
    assert got_ts == ts
    want_codes, want_scales, want_values = torchao_nvfp4(x, ts)
    assert scales[0, 0] == want_scales[0, 0] == 0x7F
    assert (codes[0, :16] == 0).all() and torch.isnan(values[0, :16]).all()
    assert scales[1, 1] == 0x7F and want_scales[1, 1] == 126
    assert torch.isnan(values[1, 16:32]).all()
    assert want_values[1, 20].item() == np.float32(6) * (np.float32(448) * np.float32(ts))  # 6 times X
    finite = torch.ones(2, 4, dtype=torch.bool)
    finite[0, 0] = finite[1, 1] = False
    assert torch.equal(scales[finite], want_scales[finite])
    assert same(values.reshape(2, 4, 16)[finite], want_values.reshape(2, 4, 16)[finite])


def transformer_engine_nvfp4(x: torch.Tensor, order: str, tile: int):
    """TransformerEngine's NVFP4 reference quantizer without the Hadamard transform
    (transformer_engine/pytorch/custom_recipes/quantization_ref_nvfp4.py), written again from
    its description, in 1x16 blocks (tile 1) or 16x16 tiles (tile 16, its weights): the
    global encode scale E = 2688 / amax; each block's decode scale rounded to E4M3, formed as
    fl32(fl32(amax_b / 6) * E) in its earlier versions (order "divide") or as amax_b times
    fl32(E * fl32(1 / 6)) in its version of 2026 (order "multiplier"); the elements x times
    fl32(1 / fl32(s * fl32(1 / E))) clamped to +-6 and rounded to nearest-even E2M1. Returns
    the element values (unscaled) and the scales, one per 1x16 run of a row ([rows, cols /
    16, 1]), and the global amax."""
    big = torch.tensor(torch.finfo(torch.float32).max)
    amax = x.abs().max().float()
    encode = torch.minimum(torch.tensor(448.0 * 6.0) / amax, big)
    if encode == 0:
        encode = torch.tensor(1.0)
    decode = 1.0 / encode
    blocks = x.reshape(x.shape[0], -1, 16)
    block_amax = blocks.abs().amax(-1, keepdim=True)
    if tile == 16:  # a tile's amax for each of its 16 rows
        tiles = block_amax.reshape(x.shape[0] // 16, 16, -1).amax(1, keepdim=True)
        block_amax = tiles.expand(-1, 16, -1).reshape(block_amax.shape)
    if order == "divide":
        block_decode = block_amax / 6.0 * encode
    else:
        block_decode = block_amax * (encode * torch.reciprocal(torch.tensor(6.0)))
    block_decode = torch.minimum(block_decode, big)
    scales = block_decode.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    element_encode = torch.minimum(1.0 / (scales * decode), big)
    scaled = (blocks * element_encode).clamp(-6, 6)
    elements = fp8lab.quantize(scaled.reshape(x.shape).contiguous(), "e2m1fn").reshape(blocks.shape)
    return elements, scales, amax


@pytest.mark.parametrize("tile", [1, 16])
@pytest.mark.parametrize("order", ["divide", "multiplier"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_nvfp4_codes_are_transformer_engines_where_its_scales_are(seed, order, tile):
    """fp8lab's nvfp4 (and nvfp4_16x16 against TE's 16x16 weight tiles) against
    TransformerEngine's reference in both of its orders: the same tensor scale; the same block
    scale for almost every block (they can differ where amax_b / (6 ts) lies within float32
    rounding of a UE4M3 midpoint: TE rounds twice in float32, fp8lab once, exactly); the same
    element codes in every block with the same nonzero scale. A block whose scale rounds to 0
    reads back as zeros in both, though TE's codes there are +-6 (its reciprocal scale
    saturates) and fp8lab's are zeros (§6.2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 256, generator=g) * torch.exp(torch.randn(256, 1, generator=g) * 3) * 2.0 ** (8 * seed - 8)
    te_elements, te_scales, amax = transformer_engine_nvfp4(x, order, tile)
    enc = fp8lab.encode(x, "nvfp4" if tile == 1 else "nvfp4_16x16")
    assert enc.tensor_scale == np.float32(amax.item() / 2688.0)
    scale_codes = torch.as_tensor(np.asarray(enc.scales)).to(torch.uint8)
    if tile == 16:  # the [16, 16] grid of tiles, one scale per 1x16 run of each of a tile's rows
        scale_codes = scale_codes.reshape(16, 16).repeat_interleave(16, 0)
    scales = fp8lab.decode(scale_codes, "ue4m3").reshape(te_scales.shape)
    elements = fp8lab.decode(torch.as_tensor(np.asarray(enc.codes)).to(torch.uint8), "e2m1fn").reshape(te_elements.shape)
    same_scale = (scales == te_scales).squeeze(-1)
    assert same_scale.float().mean() >= 0.999, f"{(~same_scale).sum().item()} block scales differ"
    both = same_scale & (scales.squeeze(-1) != 0)
    assert torch.equal(elements[both], te_elements[both])
    zero = (scales.squeeze(-1) == 0) & same_scale
    assert torch.equal(elements[zero].abs(), torch.zeros_like(elements[zero]))
    assert ((te_elements[zero].abs() == 6) | (te_elements[zero] == 0)).all()


F32_MAX = torch.tensor(torch.finfo(torch.float32).max)


def te_e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """TransformerEngine's reference E2M1 cast of values already clamped to [-6, 6], written
    again from its interval table: magnitudes in [0, 0.25] give code 0, (0.25, 0.75) 1,
    [0.75, 1.25] 2, (1.25, 1.75) 3, [1.75, 2.5] 4, (2.5, 3.5) 5, [3.5, 5] 6, above 5 7; a
    value below zero adds the sign bit 8, so -0 and NaN give code 0."""
    m = v.abs()
    magnitude = ((m > 0.25).int() + (m >= 0.75).int() + (m > 1.25).int() + (m >= 1.75).int() + (m > 2.5).int()
                 + (m >= 3.5).int() + (m > 5.0).int())
    return (magnitude + 8 * (v < 0).int()).to(torch.uint8)


def te_nvfp4_reference(x: torch.Tensor, tile: int):
    """TransformerEngine's NVFP4 reference quantizer (version of 2026, without the Hadamard
    transform) of a finite matrix, in 1x16 blocks or 16x16 tiles, written again from its
    description: E = min(fl32(2688 / amax), float32's largest) (1 where 0), D = fl32(1 / E);
    a block's scale is min(fl32(amax_b * fl32(E * fl32(1 / 6))), float32's largest) clamped to
    448 and cast to float8_e4m3fn by torch; its elements are x * r clamped to +-6 with
    r = min(fl32(1 / fl32(s * D)), float32's largest), cast by te_e2m1_codes. Returns the
    element codes, the scale bytes (one per 1x16 run of a row), D and the scaled x * r."""
    amax = x.abs().max()
    E = torch.minimum(torch.tensor(2688.0) / amax, F32_MAX)
    E = torch.where(E == 0, torch.tensor(1.0), E)
    D = torch.tensor(1.0) / E
    blocks = x.reshape(x.shape[0], -1, 16)
    block_amax = blocks.abs().amax(-1, keepdim=True)
    if tile == 16:
        tiles = block_amax.reshape(x.shape[0] // 16, 16, -1).amax(1, keepdim=True)
        block_amax = tiles.expand(-1, 16, -1).reshape(block_amax.shape)
    multiplier = E * torch.reciprocal(torch.tensor(6.0))
    s = torch.minimum(block_amax * multiplier, F32_MAX).clamp(max=448.0).to(torch.float8_e4m3fn)
    r = torch.minimum(torch.tensor(1.0) / (s.float() * D), F32_MAX)
    v = (blocks * r).clamp(-6, 6)
    return te_e2m1_codes(v).reshape(x.shape), s.view(torch.uint8).squeeze(-1), D.item(), v.reshape(x.shape)


def te_adversarial(seed: int, tensor_amax: float) -> torch.Tensor:
    """Rows of four 16-value blocks under tensor amax `tensor_amax` (element [0, 0]) that probe
    TransformerEngine's roundings: blocks whose fl32(amax_b * multiplier) is a UE4M3 value or a
    midpoint between two (subnormal scales and 448 included), and one or two float32 steps
    beside, so that its float32 product decides the scale; blocks whose scale rounds to 0
    (their elements saturate to +-6 in TE); random blocks over 40 binades; zero, negative-zero
    and E2M1-tie blocks."""
    g = torch.Generator().manual_seed(seed)
    A = torch.tensor(tensor_amax, dtype=torch.float32)
    E = torch.minimum(torch.tensor(2688.0) / A, F32_MAX)
    multiplier = E * torch.reciprocal(torch.tensor(6.0))
    blocks = [torch.randn(16, generator=g) * A * 2.0 ** e for e in range(-40, 0, 2)]
    values = UE4M3[1:].double()
    targets = torch.cat([values, (values[:-1] + values[1:]) / 2])
    for q in targets[torch.randperm(len(targets), generator=g)[:80]]:
        centre = (torch.tensor(float(q)) / multiplier).float()
        for steps in (-2, -1, 0, 1, 2):
            amax_b = centre
            for _ in range(abs(steps)):
                amax_b = torch.nextafter(amax_b, torch.tensor(float("inf") if steps > 0 else 0.0))
            if not 0 < amax_b <= A:
                continue
            b = torch.rand(16, generator=g) * amax_b * torch.sign(torch.randn(16, generator=g))
            b[int(torch.randint(16, (1,), generator=g))] = amax_b
            blocks.append(b)
    blocks += [torch.full((16,), float(A) * 2.0 ** -14), torch.full((16,), float(A) * 2.0 ** -24)]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -2.5, -5.0, 0.1, 4.9, 5.1, -6.0, 3.0])
    blocks += [torch.zeros(16), -torch.zeros(16), ties * A / 6, ties * A / 6 * 2.0 ** -5]
    while len(blocks) % 64:  # whole 16x16 tiles of 4 blocks a row
        blocks.append(torch.randn(16, generator=g) * A * 2.0 ** -3)
    x = torch.stack(blocks).float().reshape(-1, 64)
    x[0, 0] = A
    return x


@pytest.mark.parametrize("tile", [1, 16])
@pytest.mark.parametrize("tensor_amax", [2688.0, 1.0, 3.0e-3, 7.7e5])
@pytest.mark.parametrize("seed", [0, 1])
def test_nvfp4_te_is_transformer_engines_bit_for_bit(seed, tensor_amax, tile):
    """`nvfp4:te` (`nvfp4_16x16:te` for TE's 16x16 weight tiles) against TransformerEngine's
    NVFP4 reference quantizer of 2026: the same tensor scale (TE's global decode scale), every
    block scale and every element code, in blocks built to sit on its roundings; the one
    difference is -0, which TE's cast writes as code 0 (+0) and fp8lab as code 8. The values
    read back are the codes times fl32(s * D). The exact arithmetic (`nvfp4`) differs from TE
    on the same blocks."""
    x = te_adversarial(seed, tensor_amax)
    name = "nvfp4:te" if tile == 1 else "nvfp4_16x16:te"
    enc = fp8lab.encode(x, name)
    want_codes, want_scales, D, v = te_nvfp4_reference(x, tile)
    assert enc.tensor_scale == D
    scales = torch.as_tensor(np.asarray(enc.scales).astype(np.uint8))
    if tile == 16:  # one scale per tile: spread over its 16 rows' 1x16 runs
        scales = scales.reshape(x.shape[0] // 16, -1).repeat_interleave(16, 0)
    scales = scales.reshape(want_scales.shape)
    assert torch.equal(scales, want_scales), f"{(scales != want_scales).sum().item()} scales differ"
    codes = torch.as_tensor(np.asarray(enc.codes)).reshape(x.shape)
    negative_zero = (v == 0) & torch.signbit(v)
    assert negative_zero.any() and torch.equal(codes[negative_zero], torch.full_like(codes[negative_zero], 8))
    assert torch.equal(want_codes[negative_zero], torch.zeros_like(want_codes[negative_zero]))
    assert torch.equal(codes[~negative_zero], want_codes[~negative_zero]), \
        f"{(codes != want_codes)[~negative_zero].sum().item()} codes differ"
    if tile == 1:  # blocks whose scale is 0 were probed (a tile holds larger blocks too)
        assert (want_scales == 0).any() and (want_codes[(want_scales == 0).repeat_interleave(16, 1)] % 8 == 7).any()
    X = (fp8lab.decode(want_scales, "ue4m3") * torch.tensor(D)).repeat_interleave(16, 1)
    signed_codes = torch.where(negative_zero, 8, want_codes).to(torch.uint8)
    assert same(fp8lab.quantize(x, name), fp8lab.decode(signed_codes, "e2m1fn") * X)
    if tile == 1:  # the exact arithmetic rounds amax_b / (6 D) once: other scales on these blocks
        exact = fp8lab.encode(x, "nvfp4")
        assert not torch.equal(torch.as_tensor(np.asarray(exact.scales)), torch.as_tensor(np.asarray(enc.scales)))


def transformer_engine_current_scaling(x: torch.Tensor, dtype):
    """TransformerEngine's current-scaling reference quantizer (its
    custom_recipes/quantization_ref_current_scaling.py, without power-of-two scales or an
    epsilon), written again from its description: the encoding factor S = fp8_max / amax in
    float32 (float32's largest where that is infinite, 1 for a zero tensor), the codes of
    x * S converted by torch to the FP8 dtype, and the decoding scale 1 / S. Returns the codes
    (uint8), the decoding scale and the values codes times it."""
    amax = x.abs().max().float()
    S = torch.tensor(torch.finfo(dtype).max, dtype=torch.float32) / amax
    S = torch.where(S == torch.inf, torch.tensor(torch.finfo(torch.float32).max), S)
    S = torch.where(amax == 0, torch.tensor(1.0), S)
    q = (x.float() * S).to(dtype)
    scale_inv = torch.reciprocal(S)
    return q.view(torch.uint8), scale_inv, q.float() * scale_inv


def current_scaling_tensors():
    """Random tensors from 2^-30 to 2^30, one that holds float32's subnormals only (S
    overflows), a zero tensor, and tensors whose values are the FP8 midpoints times X."""
    g = torch.Generator().manual_seed(46)
    out = [torch.randn(64, 48, generator=g) * 2.0 ** e for e in range(-30, 31, 6)]
    out += [torch.randn(8, 16, generator=g) * 1e-40, torch.zeros(4, 16)]
    return out


@pytest.mark.parametrize("name,dtype", [("e4m3_tensor", torch.float8_e4m3fn), ("e5m2_tensor", torch.float8_e5m2)])
def test_te_current_scaling_is_transformer_engines_bit_for_bit(name, dtype):
    """`e4m3_tensor:te` and `e5m2_tensor:te` against TransformerEngine's current-scaling
    reference: the same codes, decoding scale and values, bit for bit; the exact arithmetic
    (`e4m3_tensor`) differs from it on the same tensors."""
    differs = 0
    tensors = current_scaling_tensors()
    # Values at the element format's rounding midpoints times the scale TE will take.
    fmt = "e4m3fn" if dtype == torch.float8_e4m3fn else "e5m2"
    codes = torch.arange(1, 120 if dtype == torch.float8_e4m3fn else 123, dtype=torch.uint8)
    grid = fp8lab.decode(codes, fmt).double()
    mids = ((grid[:-1] + grid[1:]) / 2).float()
    for amax in (3.0, 0.1, 1e4):
        S = np.float32(np.float32(torch.finfo(dtype).max) / np.float32(amax))
        X = np.float32(1) / S
        t = torch.cat([mids, -mids]) * float(X)
        t[0] = amax
        tensors.append(t.reshape(1, -1))
    for x in tensors:
        enc = fp8lab.encode(x, f"{name}:te")
        want_codes, want_inv, want_values = transformer_engine_current_scaling(x, dtype)
        got_codes = torch.as_tensor(np.asarray(enc.codes)).reshape(x.shape)
        assert torch.equal(got_codes, want_codes.reshape(x.shape)), f"{(got_codes != want_codes).sum().item()} codes differ"
        scale = np.asarray(enc.scales).view(np.float32).reshape(-1)
        assert scale[0] == want_inv.item()
        assert same(fp8lab.quantize(x, f"{name}:te"), want_values)
        differs += not same(fp8lab.quantize(x, name), want_values)
    assert differs > 0


def transformer_engine_mxfp8(x: torch.Tensor, element: str, max_e: float):
    """TransformerEngine's MXFP8 quantizer, as its C++ test reference describes it
    (tests/cpp/test_common.h: float_to_e8m0 of fl32(amax * fl32(1 / max_e)), and the
    elements x times 2^(127 - code) converted to nearest), written again here: the E8M0 code is
    the float32 exponent field of v = fl32(amax * fl32(1 / max_e)), plus one where v's
    mantissa is nonzero (at most 0xFE); a subnormal v takes 0 up to 2^-127 and 1 above; 0 for a
    zero block. Returns the E8M0 codes (one per row of 32) and the element codes."""
    blocks = x.numpy().astype(np.float32)
    v = (np.abs(blocks).max(axis=1) * (np.float32(1) / np.float32(max_e))).astype(np.float32)
    bits = v.view(np.uint32)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    codes = np.where(v == 0, 0, exponent + up).astype(np.int64)
    scaled = blocks * np.ldexp(np.float32(1), 127 - codes)[:, None].astype(np.float32)
    dtype = ml_dtypes.float8_e4m3fn if element == "e4m3fn" else ml_dtypes.float8_e5m2
    return codes, scaled.astype(dtype).view(np.uint8)


@pytest.mark.parametrize("element,max_e", [("e4m3fn", 448.0), ("e5m2", 57344.0)])
def test_mxfp8_ceil_is_transformer_engines_mxfp8(element, max_e):
    """fp8lab's `ceil` rule (`mxfp8_e4m3:ceil`) against TransformerEngine's MXFP8 quantizer:
    the same E8M0 scale and element codes for every finite block whose scale lies above E8M0's
    least (TE's scale of a block whose amax * fl32(1 / max_e) is at most 2^-127 differs by its
    own rule, and a block holding an infinity gets scale 0xFE there, NaN here, §6.2), on random
    blocks over the normal range and blocks one to five float32 steps either side of max_e
    times each power of two, where TE's float32 product could cross the power of two."""
    rows = [r for r in agreeing_blocks() if torch.isfinite(r).all()]
    g = torch.Generator().manual_seed(47)
    for k in range(-100, 101, 7):
        edge = torch.tensor(max_e * 2.0 ** k, dtype=torch.float32)
        for steps in range(-5, 6):
            a = edge
            for _ in range(abs(steps)):
                a = torch.nextafter(a, torch.tensor(float("inf") if steps > 0 else 0.0))
            b = torch.rand(32, generator=g) * a
            b[int(torch.randint(32, (1,), generator=g))] = a
            rows.append(b)
    x = torch.stack(rows).float()
    te_scales, te_codes = transformer_engine_mxfp8(x, element, max_e)
    enc = fp8lab.encode(x, f"{element}@1x32:e8m0:ceil")
    scales = np.asarray(enc.scales).reshape(-1)
    codes = np.asarray(enc.codes).reshape(x.shape)
    keep = te_scales >= 1
    assert keep.sum() > 0.9 * len(keep)
    assert (scales[keep] == te_scales[keep]).all(), np.nonzero(scales[keep] != te_scales[keep])
    assert (codes[keep] == te_codes[keep]).all()
    # The OCP floor rule (the MX presets) is not TE's: it differs on these blocks.
    assert (np.asarray(fp8lab.encode(x, f"{element}@1x32:e8m0:floor").scales).reshape(-1)[keep] != te_scales[keep]).any()


def e2m1_nearest(v: torch.Tensor) -> torch.Tensor:
    """v (float32, |v| <= about 6.4) rounded to nearest-even on the E2M1 grid, as the published
    reference rounds: steps of 0.5 below 2, of 1 below 4, of 2 above (ties to even codes)."""
    a = v.abs()
    r = torch.where(a < 2, torch.round(2 * a) / 2, torch.where(a < 4, torch.round(a), 2 * torch.round(a / 2)))
    return torch.copysign(r.clamp(max=6.0), v)


def four_over_six_reference(x: torch.Tensor):
    """The published Four Over Six quantizer (arXiv:2512.02010; the fouroversix package's
    quantize_to_fp4 with its MSE rule, 1x16 blocks), written again from its description, in its
    float32 operations: block scales fl32(fl32(amax_b * 256) / A) for 6 and that times 1.5 for 4,
    rounded to E4M3 by torch; elements fl32(fl32(x * 6 * 256) / fl32(A * s)) rounded to E2M1;
    the errors of the values e * s * A / 1536 summed in float32; 4 where its error is smaller.
    Returns the element values and the block scales."""
    A = x.abs().max().float()
    blocks = x.reshape(-1, 16).float()
    hp = blocks.abs().amax(dim=-1) * 256 / A
    candidates = []
    for s_hp in (hp, hp * 1.5):
        s = s_hp.to(torch.float8_e4m3fn).float()
        e = e2m1_nearest(torch.where(s[:, None] != 0, blocks * 6 * 256 / (A * s[:, None]), 0.0))
        err = ((e * s[:, None] * A / 1536 - blocks) ** 2).sum(dim=-1)
        candidates.append((e, s, err))
    (e6, s6, err6), (e4, s4, err4) = candidates
    four = err4 < err6
    return torch.where(four[:, None], e4, e6), torch.where(four, s4, s6), four


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_nvfp4_4over6_is_the_published_four_over_six(seed):
    """fp8lab's nvfp4_4over6 (docs/spec.md §6.10) against the published algorithm: the same
    tensor scale (A / 1536); the same choice of 4 or 6 and the same block scale in almost every
    block (they can differ where a quotient or the two errors lie within float32 rounding of a
    tie: fp8lab's candidates are exact); the same element codes wherever the scales agree.
    Blocks that choose 4 are common enough that a swapped choice would fail."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 256, generator=g) * torch.exp(torch.randn(256, 1, generator=g) * 2)
    elements, scales, four = four_over_six_reference(x)
    enc = fp8lab.encode(x, "nvfp4_4over6")
    assert enc.tensor_scale == np.float32(x.abs().max().item() / 1536.0)
    ours = fp8lab.decode(torch.as_tensor(np.asarray(enc.scales)).to(torch.uint8), "ue4m3").reshape(scales.shape)
    our_elements = fp8lab.decode(torch.as_tensor(np.asarray(enc.codes)).to(torch.uint8), "e2m1fn").reshape(
        elements.shape)
    same_scale = ours == scales
    assert same_scale.float().mean() >= 0.995, f"{(~same_scale).sum().item()} of {scales.numel()} block scales differ"
    assert 0.05 < four.float().mean() < 0.95, "both choices should occur"
    both = same_scale & (scales != 0)
    assert torch.equal(our_elements[both], elements[both])
    # The plain NVFP4 quantizer has the larger error on the same tensor (the paper's claim).
    err = lambda name: ((fp8lab.quantize(x, name) - x) ** 2).sum().item()  # noqa: E731
    assert err("nvfp4_4over6") < err("nvfp4")


def tseng_dither_scale(x: np.ndarray) -> np.ndarray:
    """Tseng et al.'s MXFP4 quantizer with `dither_scale` (their patch to microxcaling's
    _quantize_mx, amazon-science/mxfp4-llm), written again from its description, with the
    elements rounded to nearest-even (ml_dtypes' float4_e2m1fn) in place of its stochastic
    rounding: per block of 32 along the rows, e = floor(log2 amax) - 2 clamped to -127, the
    elements rounded from fl32(fl32(3 x) / 2^(e+2)) and read back as fl32(fl32(q 2^(e+2)) / 3),
    all in float32."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    _, exp = np.frexp(np.where(amax > 0, amax, 1.0).astype(np.float64))  # amax = m 2^exp, m in [0.5, 1)
    e = np.maximum(exp - 1 - 2, -127)
    e = np.where(amax > 0, e, -127)
    power = np.ldexp(np.float32(1), e + 2).astype(np.float32)  # 2^(e+2), exact in float32
    with np.errstate(over="ignore"):
        v = (np.float32(3) * blocks) / power
        q = v.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
        y = (q * power) / np.float32(3)
    return y.reshape(x.shape).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dither_scale_is_tseng_et_als_bit_for_bit(seed):
    """`mxfp4:dither-scale` with round-to-nearest-even elements against the published formula
    (its rounding aside): the same values bit for bit, from the kernels and the portable
    torch path, over blocks from 2^-140 (scales at E8M0's least) to 2^120, with E2M1 ties at
    3/4 of them, zero blocks and a block whose 3/4 lands on 6's neighbours; codes and scales
    decode to the same values."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(32, generator=g) * 2.0 ** e for e in range(-140, 121, 13)]
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4) * 4 / 3  # their 3/4 are E2M1 ties
    rows += [ties, -ties * 2.0 ** -60, torch.zeros(32), torch.full((32,), 7.99), torch.linspace(-8, 8, 32)]
    x = torch.stack(rows).float()
    want = torch.from_numpy(tseng_dither_scale(x.numpy()))
    assert same(fp8lab.quantize(x, "mxfp4:dither-scale"), want)
    assert same(fp8lab.quantize(x, "mxfp4:dither-scale", backend="torch"), want)
    enc = fp8lab.encode(x, "mxfp4:dither-scale")
    assert same(fp8lab.decode(enc), want)
    # Not the plain MX quantizer: 3/4 of the values round differently.
    assert not same(fp8lab.quantize(x, "mxfp4"), want)


def test_dither_scale_leaves_stochastic_rounding_room_and_no_bias():
    """With stochastic rounding, dither-scale never rounds past E2M1's 6 (the 3/4 leaves room
    under it for every block), so nothing saturates, and the mean of many draws is the input
    (within 5 standard errors), where the plain MX quantizer's saturation biases the largest
    values of a block down."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 32, generator=g) * torch.exp(torch.randn(64, 1, generator=g))
    total, saturating = torch.zeros_like(x, dtype=torch.float64), 0
    draws = 400
    for seed in range(draws):
        y, counts = fp8lab.quantize(x, "mxfp4:dither-scale", rounding="stochastic", seed=seed, return_counts=True)
        assert counts["overflow"] == 0
        total += y.double()
        saturating += fp8lab.quantize(x, "mxfp4", rounding="stochastic", seed=seed, return_counts=True)[1]["overflow"]
    assert saturating > 0
    mean = total / draws
    enc = fp8lab.encode(x, "mxfp4")
    step = fp8lab.decode(enc).abs().reshape(64, 1, 32).amax(-1) / 6 * 2  # the largest E2M1 step of a block, scaled
    err = (mean - x.double()).abs().reshape(64, 32)
    assert (err <= 5 * step.reshape(64, 1).double() / (2 * draws ** 0.5)).all()


# ---- Quartet II (docs/spec.md §6.13) ----------------------------------------------------------

def quartet_rtn(v: torch.Tensor) -> torch.Tensor:
    """The published rtn_fp4 (IST-DASLab/Quartet-II, nvfp4_triton.py), written again: E2M1 by
    thresholds, ties away from zero, saturating at 6."""
    a = v.abs()
    r = torch.where(a >= 5, 6.0, torch.where(a >= 3.5, 4.0, torch.where(a >= 2.5, 3.0, torch.where(
        a >= 1.75, 2.0, torch.where(a >= 1.25, 1.5, torch.where(a >= 0.75, 1.0, torch.where(a >= 0.25, 0.5, 0.0)))))))
    return torch.where(v > 0, r, -r)


def quartet_block_scales(x: torch.Tensor, top: float, val_max: torch.Tensor):
    """The published get_scales in float32: s_dec = amax / top / val_max (1 for amax 0); block
    scales (amax_b / val_max / s_dec) to E4M3 by torch, 1 where that is 0. (s_dec, the 1x16
    blocks, their scales [blocks, 1])."""
    amax = x.abs().max()
    s_dec = torch.where(amax == 0, torch.tensor(1.0), amax / torch.tensor(top, dtype=torch.float32) / val_max)
    blocks = x.reshape(-1, 16)
    s_b = (blocks.abs().amax(-1, keepdim=True) / val_max / s_dec).to(torch.float8_e4m3fn).float()
    return s_dec, blocks, torch.where(s_b == 0, 1.0, s_b)


def ms_eden_reference(x: torch.Tensor, window: int):
    """The published eden_1x16s_fp4_kernel (Quartet-II's nvfp4_triton.py, without the rotation
    its callers apply first), written again in float32 torch: scales for 255.99 and 6 / 0.988125,
    elements rounded by quartet_rtn, the correction c = sum v^2 / sum v q per window (the sums
    in float64, then float32), the corrected scale t = s_b c and its E4M3 neighbours down and up
    as the kernel finds them from t's E4M3 bits, with P(up) = (t - down) / (up - down).
    Returns (s_dec, q [blocks, 16], t, down, up, P(up)), the last four [blocks, 1]."""
    val_max = torch.tensor(6.0 / ((17 / 16) * 0.93), dtype=torch.float32)
    s_dec, blocks, s_b = quartet_block_scales(x, 255.99, val_max)
    v = blocks / (s_b * s_dec)
    q = quartet_rtn(v)
    vw, qw = v.reshape(-1, window).double(), q.reshape(-1, window).double()
    num, den = (vw * vw).sum(-1, keepdim=True).float(), (vw * qw).sum(-1, keepdim=True).float()
    c = torch.where(den == 0, 1.0, num / den)
    t = (s_b.reshape(-1, window // 16) * c).reshape(-1, 1)
    bits = t.to(torch.float8_e4m3fn).view(torch.uint8)
    prev, curr, nxt = ((bits + k).view(torch.float8_e4m3fn).float() for k in (-1, 0, 1))
    up = torch.where(curr > t, curr, nxt)
    down = torch.where(curr > t, prev, curr)
    return s_dec, q, t, down, up, (t - down) / (up - down)


def eden_probe(seed: int) -> torch.Tensor:
    """Rows of very different magnitudes, a zero window and a window with one large value."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 512, generator=g) * torch.exp(torch.randn(64, 1, generator=g) * 2)
    x[3, :128] = 0
    x[5, 130] = 50 * x[5].abs().max()
    return x


def scale_values(enc) -> torch.Tensor:
    return fp8lab.decode(torch.as_tensor(np.asarray(enc.scales)).to(torch.uint8), "ue4m3").reshape(-1, 1)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_nvfp4_eden_is_quartet_iis_ms_eden(seed, backend):
    """nvfp4_eden with nearest-away elements against the published MS-EDEN kernel: the same tensor
    scale and elements; every block's scale is one of the two E4M3 neighbours of the corrected
    scale (the lower one where that is exact); the values are fl32(fl32(q s) s_dec) of those,
    bit for bit, from the kernels and the portable torch path."""
    x = eden_probe(seed)
    s_dec, q, t, down, up, p = ms_eden_reference(x, 128)
    kw = dict(rounding="nearest-away", seed=7, backend=backend)
    enc = fp8lab.encode(x, "nvfp4_eden", **kw)
    assert enc.tensor_scale == s_dec.item()
    codes = torch.as_tensor(np.asarray(enc.codes)).to(torch.uint8)
    assert torch.equal(fp8lab.decode(codes, "e2m1fn").reshape(q.shape), q)
    s = scale_values(enc)
    assert bool(((s == down) | (s == up)).all())
    assert bool((s[p == 0] == down[p == 0]).all())
    assert 0.2 < (s == up)[(p > 0.2) & (p < 0.8)].float().mean() < 0.8, "both neighbours are drawn"
    y = fp8lab.quantize(x, "nvfp4_eden", **kw)
    assert torch.equal(y.reshape(q.shape), (q * s) * s_dec)


def test_nvfp4_eden_draws_each_neighbour_with_its_probability():
    """Over 40 seeds the number of blocks that take the upper neighbour lies within 4 standard
    deviations of the sum of the published probabilities, and the mean of <y, x> / <x, x> per
    window is 1 within 0.002 (MS-EDEN's unbiased projection), where round-to-nearest falls short."""
    x = eden_probe(2)
    _, _, _, down, up, p = ms_eden_reference(x, 128)
    n, ups = 40, torch.zeros_like(p)
    projection = torch.zeros(x.numel() // 128, dtype=torch.float64)
    xw = x.double().reshape(-1, 128)
    for seed in range(n):
        ups += (scale_values(fp8lab.encode(x, "nvfp4_eden", rounding="nearest-away", seed=seed)) == up).float()
        y = fp8lab.quantize(x, "nvfp4_eden", rounding="nearest-away", seed=seed).double().reshape(-1, 128)
        projection += (y * xw).sum(-1)
    z = (ups.sum() - n * p.sum()) / torch.sqrt(n * (p * (1 - p)).sum())
    assert abs(z.item()) < 4, z
    norm = (xw * xw).sum(-1)
    live = norm > 0
    assert abs((projection / n / norm)[live].mean().item() - 1) < 0.002
    rtn = fp8lab.quantize(x, "nvfp4_quartet", rounding="nearest-away").double().reshape(-1, 128)
    assert ((rtn * xw).sum(-1) / norm)[live].mean().item() < 0.997


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_nvfp4_quartet_is_quartet_iis_forward_quantizer(backend):
    """nvfp4_quartet with nearest-away elements against the published rtn_1x16s_fp4_kernel:
    scales for 448 and 6, values fl32(q fl32(s_b s_dec)), bit for bit; the exact arithmetic of
    plain nvfp4 differs from it on this input, whose amax / 448 / 6 rounds twice to another
    tensor scale than amax / 2688."""
    x = eden_probe(7)
    s_dec, blocks, s_b = quartet_block_scales(x, 448.0, torch.tensor(6.0))
    want = quartet_rtn(blocks / (s_b * s_dec)) * (s_b * s_dec)
    got = fp8lab.quantize(x, "nvfp4_quartet", rounding="nearest-away", backend=backend)
    assert torch.equal(got.reshape(want.shape), want)
    assert fp8lab.encode(x, "nvfp4_quartet", backend=backend).tensor_scale == s_dec.item()
    plain = fp8lab.quantize(x, "nvfp4", rounding="nearest-away", backend=backend)
    assert not torch.equal(plain.reshape(want.shape), want)
