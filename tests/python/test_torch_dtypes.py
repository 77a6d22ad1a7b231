"""fp8lab's codes as torch's float8 and float4 dtypes (fp8lab.to_torch, from_torch, decode of
a float8 tensor, ScaledCodes.to_torch), against torch's own conversions of those dtypes and
torchao's float4 packing and decoding: the same values for every code, views without copies
where the bits agree."""
import numpy as np
import pytest
import torch
from torchao.prototype.custom_fp_utils import _floatx_unpacked_to_f32
from torchao.prototype.mx_formats.kernels import pack_uint4, unpack_uint4

import fp8lab

FLOAT8 = [("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2), ("e4m3fnuz", torch.float8_e4m3fnuz),
          ("e5m2fnuz", torch.float8_e5m2fnuz), ("e8m0", torch.float8_e8m0fnu)]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other is NaN."""
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a[~torch.isnan(a)], b[~torch.isnan(b)])


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """torchao's decoding of unpacked E2M1 codes (ebits 2, mbits 1)."""
    return _floatx_unpacked_to_f32(codes, 2, 1)


@pytest.mark.parametrize("name,dtype", FLOAT8, ids=[n for n, _ in FLOAT8])
def test_every_code_reads_as_torch_reads_its_dtype(name, dtype):
    codes = torch.arange(256, dtype=torch.uint8)
    t = fp8lab.to_torch(codes, name)
    assert t.dtype == dtype and t.data_ptr() == codes.data_ptr()  # a view: no copy
    assert fp8lab.torch_dtype(name) == dtype
    assert same(t.float(), fp8lab.decode(codes, name))
    assert same(fp8lab.decode(t), t.float())  # the dtype names the format
    back, fmt = fp8lab.from_torch(t)
    assert fmt == fp8lab.Format(name) and back.data_ptr() == codes.data_ptr() and torch.equal(back, codes)


@pytest.mark.parametrize("name,dtype", FLOAT8[:4], ids=[n for n, _ in FLOAT8[:4]])
def test_torchs_encodings_are_fp8lab_codes(name, dtype):
    """torch's own float32 -> float8 conversion gives codes that fp8lab decodes to torch's values."""
    x = torch.randn(4096) * torch.exp2(torch.randint(-20, 20, (4096,)).float())
    t = x.to(dtype)
    codes, fmt = fp8lab.from_torch(t)
    assert same(fp8lab.decode(codes, fmt), t.float())


def test_float4_pairs_pack_as_torch_and_torchao_do():
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 2)  # [3, 32]: every code, both nibbles
    packed = fp8lab.to_torch(codes, "e2m1fn")
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (3, 16)
    assert torch.equal(packed.view(torch.uint8), pack_uint4(codes))
    assert torch.equal(unpack_uint4(packed.view(torch.uint8)), codes)
    assert same(e2m1_values(codes), fp8lab.decode(codes, "e2m1fn"))
    back, fmt = fp8lab.from_torch(packed)
    assert fmt == fp8lab.Format("e2m1fn") and torch.equal(back, codes)
    assert same(fp8lab.decode(packed), fp8lab.decode(codes, "e2m1fn"))


def test_scaled_codes_as_torch_dtypes():
    torch.manual_seed(0)
    x = torch.randn(8, 64) * torch.exp2(torch.randint(-8, 8, (8, 1)).float())
    mx = fp8lab.encode(x, "mxfp8_e4m3")
    elems, scales = mx.to_torch()
    assert elems.dtype == torch.float8_e4m3fn and scales.dtype == torch.float8_e8m0fnu and scales.shape == (8, 2)
    by_torch = elems.float() * scales.float().repeat_interleave(32, dim=1)
    assert same(by_torch, fp8lab.decode(mx))

    nv = fp8lab.encode(x, "nvfp4")
    elems, scales = nv.to_torch()
    assert elems.dtype == torch.float4_e2m1fn_x2 and elems.shape == (8, 32) and scales.dtype == torch.float8_e4m3fn
    X = (scales.double() * nv.tensor_scale).float()  # each group's scale times the tensor scale (spec §6.3)
    by_torchao = e2m1_values(unpack_uint4(elems.view(torch.uint8))) * X.repeat_interleave(16, dim=1)
    assert same(by_torchao, fp8lab.decode(nv))

    ds = fp8lab.encode(x, "deepseek_1x128")
    elems, scales = ds.to_torch()
    assert scales.dtype == torch.float32 and scales.shape == (8, 1)
    assert same(elems.float() * scales.repeat_interleave(128, dim=1)[:, :64], fp8lab.decode(ds))

    npy = fp8lab.encode(x.numpy(), "mxfp8_e4m3")  # NumPy codes convert too
    assert torch.equal(npy.to_torch()[0].view(torch.uint8), mx.codes)


def test_what_has_no_torch_dtype_is_refused_with_the_list():
    with pytest.raises(ValueError, match=r"1\.4\.3:10 has no torch dtype; .*float8_e4m3fn \(1\.4\.3:fn\)"):
        fp8lab.to_torch(torch.zeros(4, dtype=torch.uint8), "1.4.3:10")
    with pytest.raises(ValueError, match="even count"):
        fp8lab.to_torch(torch.zeros(3, dtype=torch.uint8), "e2m1fn")
    with pytest.raises(ValueError, match="above 15"):
        fp8lab.to_torch(torch.full((2,), 16, dtype=torch.uint8), "e2m1fn")
    with pytest.raises(TypeError, match="expected the uint8 codes"):
        fp8lab.to_torch(torch.zeros(4), "e4m3fn")
    with pytest.raises(TypeError, match="float32 holds no fp8lab codes"):
        fp8lab.from_torch(torch.zeros(4))
    with pytest.raises(ValueError, match="the codes are 1.4.3:fn .*not 1.5.2:ieee"):
        fp8lab.decode(torch.zeros(4).to(torch.float8_e4m3fn), "e5m2")
    with pytest.raises(ValueError, match="has no torch dtype"):
        fp8lab.encode(torch.randn(2, 32), "mxfp6_e2m3").to_torch()
    assert fp8lab.torch_dtype("1.5.2:24") is None
    assert np.isnan(fp8lab.decode(torch.tensor([0x7F], dtype=torch.uint8).view(torch.float8_e4m3fn)).item())
