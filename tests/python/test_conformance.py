"""fp8lab's MX quantizers against torchao's (torchao.prototype.mx_formats.to_mx, a test
dependency), and its NVFP4 quantizer against TransformerEngine's documented reference
algorithm, block by block (docs/spec.md §6.9). MX: fp8lab's `floor`
scales are torchao's FLOOR, its `ceil` scales torchao's RCEIL, bit for bit, for
every element format, wherever a block's largest magnitude is a finite normal float32; the
two conventions that differ are pinned, with fp8lab's side checked against ml_dtypes."""
import ml_dtypes
import numpy as np
import pytest
import torch
from torchao.prototype.custom_fp_utils import _floatx_unpacked_to_f32
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
from torchao.prototype.mx_formats.kernels import unpack_uint4
from torchao.prototype.mx_formats.mx_tensor import get_fp_scale, to_mx

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


def transformer_engine_nvfp4(x: torch.Tensor):
    """TransformerEngine's documented NVFP4 reference quantizer (1x16 blocks, no Hadamard
    transform; transformer_engine/pytorch/custom_recipes/quantization_ref_nvfp4.py), written
    again from its description: the global encode scale 2688 / amax, each block's decode
    scale fl32(fl32(amax_b / 6) * global) rounded to E4M3, the elements x times
    fl32(1 / fl32(s / global)) clamped to +-6 and rounded to nearest-even E2M1. Returns the
    element values (unscaled), the block scales and the global amax."""
    big = torch.tensor(torch.finfo(torch.float32).max)
    amax = x.abs().max().float()
    encode = torch.minimum(torch.tensor(448.0 * 6.0) / amax, big)
    if encode == 0:
        encode = torch.tensor(1.0)
    decode = 1.0 / encode
    blocks = x.reshape(x.shape[0], -1, 16)
    block_decode = torch.minimum(blocks.abs().amax(-1, keepdim=True) / 6.0 * encode, big)
    scales = block_decode.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    element_encode = torch.minimum(1.0 / (scales * decode), big)
    scaled = (blocks * element_encode).clamp(-6, 6)
    elements = fp8lab.quantize(scaled.reshape(x.shape).contiguous(), "e2m1fn").reshape(blocks.shape)
    return elements, scales, amax


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_nvfp4_codes_are_transformer_engines_where_its_scales_are(seed):
    """fp8lab's nvfp4 against TransformerEngine's reference: the same tensor scale; the same
    block scale for almost every block (they can differ where amax_b / (6 ts) lies within
    float32 rounding of a UE4M3 midpoint: TE rounds twice in float32, fp8lab once, exactly);
    the same element codes in every block with the same nonzero scale. A block whose scale
    rounds to 0 reads back as zeros in both, though TE's codes there are +-6 (its reciprocal
    scale saturates) and fp8lab's are zeros (§6.2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 256, generator=g) * torch.exp(torch.randn(256, 1, generator=g) * 3) * 2.0 ** (8 * seed - 8)
    te_elements, te_scales, amax = transformer_engine_nvfp4(x)
    enc = fp8lab.encode(x, "nvfp4")
    assert enc.tensor_scale == np.float32(amax.item() / 2688.0)
    scales = fp8lab.decode(torch.as_tensor(np.asarray(enc.scales)).to(torch.uint8), "ue4m3").reshape(te_scales.shape)
    elements = fp8lab.decode(torch.as_tensor(np.asarray(enc.codes)).to(torch.uint8), "e2m1fn").reshape(te_elements.shape)
    same_scale = (scales == te_scales).squeeze(-1)
    assert same_scale.float().mean() >= 0.999, f"{(~same_scale).sum().item()} block scales differ"
    both = same_scale & (scales.squeeze(-1) != 0)
    assert torch.equal(elements[both], te_elements[both])
    zero = (scales.squeeze(-1) == 0) & same_scale
    assert torch.equal(elements[zero].abs(), torch.zeros_like(elements[zero]))
    assert ((te_elements[zero].abs() == 6) | (te_elements[zero] == 0)).all()
