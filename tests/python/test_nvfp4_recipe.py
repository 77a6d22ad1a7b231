"""Parts of NVIDIA's NVFP4 training recipe as fp8lab runs them (docs/spec.md §6.6): 16x16
weight tiles give the weight and its transpose one quantization, so the forward product
and grad_x's read the same values; 1x16 blocks give each product its own."""
import torch

import fp8lab
import fp8lab.torch as ft

TILES = "e2m1fn@16x16:ue4m3:nearest:tensor-scale-folded"
ROWS = "e2m1fn@1x16:ue4m3:nearest:tensor-scale-folded"


def _linear(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, spec: str):
    x = x.clone().requires_grad_()
    y = ft.linear(x, w.clone().requires_grad_(), None, ft.layer("l", w=spec))
    y.backward(g)
    return y, x.grad


def test_16x16_weight_tiles_are_one_quantization_for_w_and_its_transpose():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(48, 80, generator=g) * torch.exp(torch.randn(48, 1, generator=g))
    x, grad = torch.randn(8, 80, generator=g), torch.randn(8, 48, generator=g)
    q = fp8lab.quantize(w, TILES)
    assert torch.equal(fp8lab.quantize(w.t().contiguous(), TILES), q.t())  # the tiles of W^T are W's
    y, dx = _linear(x, w, grad, TILES)
    assert torch.equal(y, x @ q.t()) and torch.equal(dx, grad @ q)  # both products read the same Q(W)

    by_rows = fp8lab.quantize(w, ROWS)  # 1x16 along the input features (forward)
    by_cols = fp8lab.quantize(w.t().contiguous(), ROWS).t()  # along the output features (grad_x)
    assert not torch.equal(by_rows, by_cols)
    y, dx = _linear(x, w, grad, ROWS)
    assert torch.equal(y, x @ by_rows.t()) and torch.equal(dx, grad @ by_cols)
