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


def test_four_over_six_tiles_are_one_choice_for_w_and_its_transpose():
    """Four Over Six (docs/spec.md §6.10) on 16x16 weight tiles: each tile's choice of 4 or 6
    is made once, so W^T's tiles are W's and both products read the same values, which differ
    from plain NVFP4's tiles."""
    tiles = TILES + ":4over6"
    g = torch.Generator().manual_seed(5)
    w = torch.randn(48, 80, generator=g) * torch.exp(torch.randn(48, 1, generator=g))
    x, grad = torch.randn(8, 80, generator=g), torch.randn(8, 48, generator=g)
    q = fp8lab.quantize(w, tiles)
    assert torch.equal(fp8lab.quantize(w.t().contiguous(), tiles), q.t())
    assert not torch.equal(q, fp8lab.quantize(w, TILES))
    y, dx = _linear(x, w, grad, tiles)
    assert torch.equal(y, x @ q.t()) and torch.equal(dx, grad @ q)


def test_the_four_over_six_recipe_trains():
    """The recipe nvfp4-4over6 is nvfp4-training with 4over6 on every operand; a small model
    takes steps with it and its loss stays finite and falls."""
    r = fp8lab.Recipe("nvfp4-4over6")
    assert r.base["w"] == "e2m1fn@16x16:ue4m3:nearest:tensor-scale:4over6"
    assert r.base["gx"] == "e2m1fn@1x16:ue4m3:nearest:tensor-scale:4over6/stochastic"
    assert r.to_line().replace(":4over6", "").replace("nvfp4-4over6", "nvfp4-training") == \
        fp8lab.Recipe("nvfp4-training").to_line()
    _trains("nvfp4-4over6")


def _trains(recipe: str) -> None:
    """A small model takes 30 SGD steps under `recipe`: its loss stays finite and falls."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 4))
    qmodel = ft.quantize_model(model, recipe)
    opt = torch.optim.SGD(qmodel.parameters(), lr=0.05)
    x = torch.randn(256, 32)
    target = (x[:, :4] > 0).float() @ torch.tensor([1.0, 2.0, 3.0, 4.0]) % 4
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(qmodel(x), target.long())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(map(lambda v: v == v and abs(v) < 1e6, losses)), losses
    assert losses[-1] < losses[0], losses


def test_transformer_engines_arithmetic_trains():
    """nvfp4-training with TransformerEngine's arithmetic on every operand (docs/spec.md §6.9)."""
    _trains("nvfp4-training,a=nvfp4:te,w=nvfp4_16x16:te,gx=nvfp4:te/stochastic")


def test_dither_scale_with_the_transform_on_both_backward_products_trains():
    """MXFP4 with dither-scale and stochastic rounding on the gradients and a Hadamard
    transform of 64 on both backward products (docs/spec.md §6.6, §6.11): the quantizer and
    transforms of Tseng et al.'s recipe (which keeps the forward products in bfloat16)."""
    _trains("a=mxfp4:dither-scale,w=mxfp4:dither-scale,gx=mxfp4:dither-scale/stochastic,hadamard=64,"
            "hadamard_on=backward")


def test_tsengs_recipe_trains():
    """Tseng et al.'s recipe as a preset: a bfloat16 forward, both backward products in MXFP4
    with dither-scale and stochastic rounding after the Hadamard transform of 64 (docs/spec.md
    §6.12)."""
    _trains("mxfp4-tseng")


def test_quartet_iis_recipe_trains():
    """Quartet II as a preset (docs/spec.md §6.13): the forward in NVFP4 with Quartet II's
    arithmetic and nearest-away elements; both backward products in MS-EDEN's NVFP4 on the
    forward's quantized operands, after the random Hadamard transform of 128; the
    corrected scales are drawn anew in each step."""
    r = fp8lab.Recipe("nvfp4-quartet2")
    eden = "e2m1fn@1x16:ue4m3:nearest:tensor-scale:quartet:eden-128/nearest-away"
    assert (r.base["gx"], r.base["a"]) == (eden, "e2m1fn@1x16:ue4m3:nearest:tensor-scale:quartet/nearest-away")
    middle = r.resolve("fc", 1, 3)
    assert (middle.a_bwd, middle.w_bwd, middle.bwd_from) == (eden, eden, "forward")
    _trains("nvfp4-quartet2")
