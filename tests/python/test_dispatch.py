"""fp8lab.torch.quantized: every product a program runs, whoever wrote it.

Where quantize_model also applies, the dispatch path must give its bits (outputs, every
gradient, buffers, layer names and counts); functional products (F.linear with a module's
own parameter, addmm as GPT-2's Conv1D computes, einsum, conv1d, scaled_dot_product_attention)
must equal torch's float32 op on the operands fp8lab.quantize makes; products it does not
quantize must be counted and named; and the models people train (transformers' GPT-2, Llama,
Mistral, Mixtral, BERT, ViT, ResNet, T5, built from configs) must have every product quantized,
as many layers as a hand count of their products, and train a step with a finite loss.
"""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers

import fp8lab
import fp8lab.torch as ft
from conftest import same

A, W = "1.4.3:10", "1.4.3:14"
MIXED = "resnet32-mixed"  # a=1.4.3:10, w=1.4.3:14, gx=1.5.2:33, gw=1.5.2:31


def q(t, fmt):
    return fp8lab.quantize(t.detach().contiguous(), fmt)


class Net(torch.nn.Module):
    """Conv, batch norm, dropout, Linear, a product of activations and a last Linear."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.2)
        self.fc = torch.nn.Linear(4 * 8 * 8, 16)
        self.out = torch.nn.Linear(16, 10)

    def forward(self, x):
        h = self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1)
        h = self.fc(h)
        a = h @ h.t()
        return self.out(h + a.sum(1, keepdim=True) * 1e-3)


def _step(path, recipe, steps=2):
    """Two training steps of Net on either path: outputs, gradients, buffers, state."""
    torch.manual_seed(0)
    m = Net()
    x = torch.randn(4, 3, 8, 8)
    outs, grads = [], []
    if path == "module":
        m = ft.quantize_model(m, recipe)
        program = None
    else:
        program = ft.quantized(m, recipe)
    for _ in range(steps):
        m.zero_grad()
        if program is None:
            y = m(x)
        else:
            with program:
                y = m(x)
        y.square().sum().backward()
        outs.append(y.detach())
        grads.append([p.grad.clone() for p in m.parameters()])
    return outs, grads, [b.clone() for b in m.buffers()], ft.quant_state(m)


@pytest.mark.parametrize("recipe", [MIXED, "a=1.4.3:10/stochastic,w=1.4.3:14,gx=1.5.2:33/stochastic,gw=1.5.2:31,last=fp32",
                                    "mxfp8", "nvfp4"])
def test_the_dispatch_path_gives_the_module_paths_bits(recipe):
    mo, mg, mb, ms = _step("module", recipe)
    do, dg, db, ds = _step("dispatch", recipe)
    assert list(ds.layers) == list(ms.layers) == ["conv", "fc", "matmul", "out"]
    for a, b in zip(mo, do):
        same(a, b)
    for ga, gb in zip(mg, dg):
        for a, b in zip(ga, gb):
            same(a, b)
    for a, b in zip(mb, db):  # batch norm's running statistics: the discovery pass leaves none
        assert torch.equal(a, b)
    assert ds.counts() == ms.counts()
    assert ds.quantizers() == ms.quantizers()
    assert not ds.unquantized
    if "last=fp32" in recipe:
        assert ds.quantizers()["out"] == {"a": "fp32", "w": "fp32", "gx": "fp32", "gw": "fp32"}


class Functional(torch.nn.Module):
    """Products no module owns: F.linear with its own parameter, GPT-2's addmm, `@` with a
    parameter, einsum with one, conv1d."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(12, 8) * 0.3)
        self.c_w = torch.nn.Parameter(torch.randn(12, 6) * 0.3)  # Conv1D: [in, out]
        self.c_b = torch.nn.Parameter(torch.randn(6) * 0.1)
        self.m = torch.nn.Parameter(torch.randn(6, 5) * 0.3)
        self.e = torch.nn.Parameter(torch.randn(4, 5) * 0.3)
        self.k = torch.nn.Parameter(torch.randn(3, 1, 3) * 0.3)

    def forward(self, x):
        h = F.linear(x, self.w)
        h = torch.addmm(self.c_b, h, self.c_w)
        h = h @ self.m
        h = torch.einsum("bi,oi->bo", h, self.e)
        return F.conv1d(h.unsqueeze(1), self.k, padding=1)


def test_functional_products_are_quantized():
    torch.manual_seed(1)
    m, x = Functional(), torch.randn(5, 8)
    with ft.quantized(m, f"a={A},w={W},gx=1.5.2:33,gw=1.5.2:31,first=true") as program:
        y = m(x)
    st = ft.quant_state(m)
    assert list(st.layers) == ["w", "c_w", "m", "e", "k"]
    assert not st.unquantized
    # The forward, product by product, from torch's float32 ops on fp8lab.quantize's values
    # (the first layer's input stays float32).
    h = F.linear(x, q(m.w, W))
    h = torch.addmm(m.c_b, q(h, A), q(m.c_w, W))
    h = q(h, A) @ q(m.m, W)
    h = q(h, A) @ q(m.e, W).t()
    want = F.conv1d(q(h, A).unsqueeze(1), q(m.k, W), padding=1)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)
    y.sum().backward()
    assert program.state.counts()["m"]["gx"]["total"] == 5 * 5  # backward quantized too
    assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1)])
def test_addmm_and_baddbmm_scale_as_torch_does(beta, alpha):
    torch.manual_seed(8)
    inp2, m1, m2 = torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)
    inp3, b1, b2 = torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)

    class S(torch.nn.Module):
        def forward(self):
            return (torch.addmm(inp2, m1, m2, beta=beta, alpha=alpha),
                    torch.baddbmm(inp3, b1, b2, beta=beta, alpha=alpha))
    m = S()
    with ft.quantized(m, "fp32"):
        got = m()
    for g, want in zip(got, m()):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)
    assert list(ft.quant_state(m).layers) == ["matmul", "matmul_1"] and not ft.quant_state(m).unquantized
    with ft.quantized(m):
        torch.addmm(inp2.double(), m1.double(), m2.double())
    assert ft.quant_state(m).unquantized["matmul"][1] == "float64 operands (fp8lab quantizes products of float32, bfloat16 and float16 values)"


class Attention(torch.nn.Module):
    def __init__(self, gqa=False):
        super().__init__()
        self.gqa = gqa

    def forward(self, q_, k, v, mask=None, causal=False):
        return F.scaled_dot_product_attention(q_, k, v, attn_mask=mask, is_causal=causal, enable_gqa=self.gqa)


@pytest.mark.parametrize("case", ["plain", "causal", "bool-mask", "float-mask", "gqa"])
def test_scaled_dot_product_attention_is_its_two_products(case):
    torch.manual_seed(2)
    qq, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    if case == "gqa":
        k, v = k[:, :2], v[:, :2]
    mask = {"bool-mask": torch.rand(5, 7) > 0.3, "float-mask": torch.randn(5, 7)}.get(case)
    if case == "causal":
        k, v = k[:, :, :5], v[:, :, :5]
    m = Attention(gqa=case == "gqa")
    want = m(qq, k, v, mask, case == "causal")
    with ft.quantized(m, "fp32"):
        got = m(qq, k, v, mask, case == "causal")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert list(ft.quant_state(m).layers) == ["scores", "context"]
    m2 = Attention(gqa=case == "gqa")
    with ft.quantized(m2, f"a={A},w={W},gx=1.5.2,gw=1.5.2,first=false"):
        got = m2(qq, k, v, mask, case == "causal")
    if case == "gqa":
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = q(qq * (1 / 8 ** 0.5), A) @ q(k, A).transpose(-2, -1)
    if case == "causal":
        scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    torch.testing.assert_close(got, q(torch.softmax(scores, -1), A) @ q(v, A), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("equation,shapes", [("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
                                             ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
                                             ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),
                                             ("ij,kj->ik", [(3, 4), (5, 4)]),
                                             ("bi,bj->bij", [(2, 3), (2, 4)]),
                                             ("abc,cd->abd", [(2, 3, 4), (4, 6)]),
                                             ("ij,jk->", [(3, 4), (4, 5)])])
def test_einsum_is_taken_apart_into_products(equation, shapes):
    torch.manual_seed(3)
    ops = [torch.randn(s) for s in shapes]

    class E(torch.nn.Module):
        def forward(self, *xs):
            return torch.einsum(equation, *xs)
    m = E()
    with ft.quantized(m, "fp32"):
        got = m(*ops)
    torch.testing.assert_close(got, torch.einsum(equation, *ops), rtol=1e-5, atol=1e-5)
    st = ft.quant_state(m)
    assert len(st.layers) == len(ops) - 1 and not st.unquantized


def _ops_cases():
    """(name, the op on its operands, operand shapes, layers): torch's other products."""
    r = torch.randn
    return [
        ("mv", torch.mv, [(3, 4), (4,)], 1),
        ("dot", torch.dot, [(4,), (4,)], 1),
        ("vdot", torch.vdot, [(4,), (4,)], 1),
        ("outer", torch.outer, [(3,), (4,)], 1),
        ("matmul 1-d @ 3-d", torch.matmul, [(4,), (2, 4, 3)], 1),
        ("matmul 3-d @ 1-d", torch.matmul, [(2, 3, 4), (4,)], 1),
        ("matmul 1-d @ 1-d", torch.matmul, [(4,), (4,)], 1),
        ("inner", torch.inner, [(2, 3, 4), (5, 4)], 1),
        ("tensordot 2", lambda a, b: torch.tensordot(a, b), [(2, 3, 4), (3, 4, 5)], 1),
        ("tensordot pairs", lambda a, b: torch.tensordot(a, b, dims=([0, 2], [2, 1])), [(2, 3, 4), (5, 4, 2)], 1),
        ("multi_dot", lambda a, b, c: torch.linalg.multi_dot([a, b, c]), [(4,), (4, 3), (3, 2)], 2),
        ("chain_matmul", torch.chain_matmul, [(2, 4), (4, 3), (3, 2)], 2),
        ("addmv", lambda i, m, v: torch.addmv(i, m, v, beta=0.5, alpha=2.0), [(3,), (3, 4), (4,)], 1),
        ("addbmm", lambda i, a, b: torch.addbmm(i, a, b, alpha=0.5), [(3, 5), (2, 3, 4), (2, 4, 5)], 1),
        ("addr", lambda i, u, v: torch.addr(i, u, v, beta=2.0), [(3, 4), (3,), (4,)], 1),
        ("addmm_", lambda i, a, b: i.clone().addmm_(a, b, alpha=3.0), [(3, 5), (3, 4), (4, 5)], 1),
        ("baddbmm_", lambda i, a, b: i.clone().baddbmm_(a, b), [(2, 3, 5), (2, 3, 4), (2, 4, 5)], 1),
        ("einsum ...", lambda a, b: torch.einsum("...ij,...jk->...ik", a, b), [(2, 3, 4), (1, 4, 5)], 1),
        ("einsum ... implicit", lambda a, b: torch.einsum("b...i,i...", a, b), [(2, 3, 4), (4, 3)], 1),
        ("bilinear", lambda a, b, w, c: F.bilinear(a, b, w, c), [(2, 3, 4), (2, 3, 5), (6, 4, 5), (6,)], 2),
    ]


@pytest.mark.filterwarnings("ignore:torch.chain_matmul is deprecated")
@pytest.mark.parametrize("case", _ops_cases(), ids=lambda c: c[0])
def test_the_other_products_are_quantized(case):
    """Each is a quantized product: float32 quantizers give torch's values and gradients;
    1.4.3:10 on the activations gives torch's op on fp8lab.quantize's operands."""
    _, op, shapes, layers = case
    torch.manual_seed(9)
    xs = [torch.randn(s, requires_grad=True) for s in shapes]

    class Op(torch.nn.Module):
        def forward(self, *ts):
            return op(*ts)
    m = Op()
    with ft.quantized(m, "fp32"):
        got = m(*xs)
    want = op(*xs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(want)
    grads = torch.autograd.grad(got, xs, g)
    for a, b in zip(grads, torch.autograd.grad(want, xs, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    st = ft.quant_state(m)
    assert len(st.layers) == layers and not st.unquantized, (list(st.layers), st.unquantized)

    if layers == 1:
        m2 = Op()
        with ft.quantized(m2, f"a={A},w={A},gx=fp32,gw=fp32,first=false"):
            got = m2(*xs)
        inputs = len(shapes) - 2  # addmv, addbmm, addr and the in-place ones add an input
        qs = [x.detach() for x in xs[:inputs]] + [q(x, A) for x in xs[inputs:]]
        torch.testing.assert_close(got, op(*qs), rtol=1e-5, atol=1e-5)


_CONVS = [  # (op, input shape, weight shape, keyword arguments)
    (F.conv3d, (2, 4, 5, 6, 5), (6, 2, 3, 2, 3), dict(stride=(1, 2, 1), padding=1, dilation=(1, 1, 2), groups=2)),
    (F.conv3d, (3, 4, 4, 4), (2, 3, 3, 3, 3), dict(padding="same")),  # unbatched, padding by name
    (F.conv_transpose1d, (2, 4, 7), (4, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    (F.conv_transpose2d, (2, 4, 5, 5), (4, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0), groups=2, dilation=(1, 2))),
    (F.conv_transpose3d, (1, 2, 3, 4, 3), (2, 2, 2, 2, 2), dict(stride=2, output_padding=(1, 0, 1))),
]


@pytest.mark.parametrize("case", _CONVS, ids=lambda c: f"{c[0].__name__}{c[1]}" if isinstance(c, tuple) else str(c))
def test_nd_and_transposed_convolutions_are_quantized(case):
    """conv3d and the transposed convolutions: with float32 quantizers torch's values and
    gradients; quantized, torch's op on fp8lab.quantize's operands forward, and backward
    dx, dw from the quantized gradient (dw quantized again), as spec §4 defines them."""
    op, xs, ws, kw = case
    torch.manual_seed(10)
    x, w, b = torch.randn(xs, requires_grad=True), torch.randn(ws, requires_grad=True), None
    out_channels = ws[0] if op is F.conv3d else ws[1] * kw.get("groups", 1)
    b = torch.randn(out_channels, requires_grad=True)

    class C(torch.nn.Module):
        def forward(self, x, w, b):
            return op(x, w, b, **kw)
    want = op(x, w, b, **kw)
    g = torch.randn_like(want)
    m = C()
    with ft.quantized(m, "fp32"):
        got = m(x, w, b)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, e in zip(torch.autograd.grad(got, (x, w, b), g), torch.autograd.grad(want, (x, w, b), g)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)

    GX, GW = "1.5.2:33", "1.5.2:31"
    m = C()
    with ft.quantized(m, f"a={A},w={W},gx={GX},gw={GW},first=false"):
        got = m(x, w, b)
    xq, wq = q(x, A).requires_grad_(), q(w, W).requires_grad_()
    ref = op(xq, wq, b, **kw)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    dx, dw, db = torch.autograd.grad(got, (x, w, b), g)
    rdx, rdw = torch.autograd.grad(ref, (xq, wq), q(g, GX))
    torch.testing.assert_close(dx, rdx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw, q(rdw, GW), rtol=1e-5, atol=1e-5)
    channels = 0 if x.dim() == w.dim() - 1 else 1  # an unbatched input's channels come first
    torch.testing.assert_close(db, g.sum([d for d in range(g.dim()) if d != channels]))
    st = ft.quant_state(m)
    assert len(st.layers) == 1 and not st.unquantized
    c = st.counts()[next(iter(st.layers))]
    assert c["a"]["total"] == x.numel() and c["w"]["total"] == w.numel() and c["gw"]["total"] == w.numel()


def test_convolutions_the_compute_layer_does_not_model_are_reported():
    m = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 1), torch.nn.ConvTranspose2d(2, 1, 2))
    with ft.quantized(m, MIXED, accumulate="1.8.10@16"):
        m[0](torch.randn(1, 1, 2, 2, 2))
        m[1](torch.randn(1, 2, 3, 3))
    u = ft.quant_state(m).unquantized
    assert set(u) == {"0", "1"} and all("modelled for linear layers, 2-d convolutions and matmuls" in r for _, r in
                                        u.values())
    chunked = ft.layer("c", ft.context(accumulate="1.8.10@16"), a="1.4.3", w="1.4.3")
    with pytest.raises(ValueError, match="N-d and transposed convolutions run float32 products"):
        ft.conv(torch.randn(1, 1, 2, 2, 2), torch.randn(2, 1, 1, 1, 1), None, chunked)
    plain = ft.layer("c", a="1.4.3", w="1.4.3")
    with pytest.raises(ValueError, match="the input has 3 channels, the weight takes 1"):
        ft.conv(torch.randn(1, 3, 2, 2, 2), torch.randn(2, 1, 1, 1, 1), None, plain)
    with pytest.raises(ValueError, match="stride takes one value or 3, got 2"):
        fp8lab._core.quant_conv(torch.randn(1, 1, 2, 2, 2), torch.randn(2, 1, 1, 1, 1), None, [1, 1], [0], [1],
                                False, [0], 1, plain)


class Unsupported(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4).double()
        self.lstm = torch.nn.LSTM(2, 2)

    def forward(self, x):
        a = b = 0
        c = self.fc(x.view(1, 4).double()).sum().float()
        d = torch.ops.aten.mm(x.view(2, 2), x.view(2, 2)).sum()  # below every torch function
        e = torch.einsum("ii->i", x.view(2, 2)).sum()  # one operand: no product
        f = torch.einsum("ii,i->i", x.view(2, 2), x[:2]).sum()  # a diagonal
        g = self.lstm(x.view(2, 1, 2))[0].sum()  # a fused recurrent kernel
        return a + b + c + d + e + f + g


def test_products_left_float32_are_counted_named_and_warned_once():
    m = Unsupported()
    x = torch.randn(4)
    program = ft.quantized(m, MIXED)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            with program:
                m(x)
    u = ft.quant_state(m).unquantized
    assert u["fc"] == (2, "float64 operands (fp8lab quantizes products of float32, bfloat16 and float16 values)")
    assert u["aten.mm"] == (1, "an ATen product below a function fp8lab does not take apart")  # first step only
    assert u["einsum"][1].startswith("einsum 'ii,i->i' is not taken apart (a letter twice")
    lstm = [k for k in u if k.startswith("lstm.aten.")]  # mkldnn_rnn_layer, or addmm where oneDNN is off
    assert lstm and all(u[k][1] == "an ATen product below a function fp8lab does not take apart" for k in lstm)
    assert len(u) == 3 + len(lstm) and not ft.quant_state(m).layers
    said = [str(x.message) for x in w if "fp8lab" in str(x.message)]
    assert len(said) == 1 and f"{3 + len(lstm)} products ran in float32" in said[0] and "fc (1x: float64" in said[0]
    assert "float32 in 2 calls (float64 operands" in repr(ft.quant_state(m))


def test_the_program_is_one_per_model_and_steps_on():
    torch.manual_seed(4)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4))
    program = ft.quantized(m, MIXED)
    assert ft.quantized(m, MIXED) is program and ft.quantized(m) is not None
    with pytest.raises(ValueError, match="quantized already with recipe 'resnet32-mixed'"):
        ft.quantized(m, "mxfp8")
    with pytest.raises(ValueError, match="quantized already"):
        ft.quantize_model(m, MIXED)
    for _ in range(3):
        with program:
            m(torch.randn(2, 4))
    assert ft.quant_state(m).step == 3
    with program:
        with pytest.raises(RuntimeError, match="entered already"):
            program.__enter__()
    with pytest.raises(ZeroDivisionError):  # an error inside leaves nothing behind
        with program:
            1 / 0
    assert torch.overrides._get_current_function_mode_stack() == []
    assert not m._forward_hooks and not m[0]._forward_pre_hooks
    lone = torch.nn.Linear(2, 2)
    with ft.quantized(lone, "a=1.4.3,w=1.4.3,gx=1.5.2,gw=1.5.2,last=fp32"):  # a product before any forward
        torch.randn(2, 3) @ torch.randn(3, 2)
    assert ft.quant_state(lone).quantizers()["matmul"]["w"] == "1.4.3"
    with pytest.raises(TypeError, match="takes a torch.nn.Module"):
        ft.quantized(lambda x: x, MIXED)


class WithAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 4, batch_first=True)
        self.fc = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.attn(x, x, x, need_weights=False)[0])


def test_multihead_attention_gives_the_module_paths_bits():
    torch.manual_seed(5)
    base, x = WithAttention(), torch.randn(2, 6, 16)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    ya = ft.quantize_model(a, "mxfp8")(x)
    with ft.quantized(b, "mxfp8"):
        yb = b(x)
    same(ya, yb)
    ya.sum().backward()
    yb.sum().backward()
    for pa, pb in zip(a.parameters(), b.parameters()):
        same(pa.grad, pb.grad)
    assert ft.quant_state(a).counts() == ft.quant_state(b).counts()  # one packed projection on both
    assert list(ft.quant_state(b).layers) == ["attn.in_proj", "attn.scores", "attn.context", "attn.out_proj", "fc"]


# ---- the models people train, from transformers' configs --------------------------------------

def _lm(cls, cfg_cls, **kw):
    common = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                  max_position_embeddings=32)
    common.update(kw)
    return cls(cfg_cls(**common))


def _models():
    t = transformers
    vision = dict(image_size=16, num_channels=3)
    image32 = dict(image_size=32, num_channels=3)
    return {
        # per block: attention's c_attn, scores, context, c_proj, the MLP's two; lm_head
        "gpt2": (lambda: t.GPT2LMHeadModel(t.GPT2Config(vocab_size=64, n_embd=32, n_head=4, n_layer=2,
                                                         n_positions=32)), 2 * 6 + 1, "lm"),
        # q, k, v, scores, context, o, gate, up, down; lm_head
        "llama": (lambda: _lm(t.LlamaForCausalLM, t.LlamaConfig, num_key_value_heads=2), 2 * 9 + 1, "lm"),
        "mistral": (lambda: _lm(t.MistralForCausalLM, t.MistralConfig, num_key_value_heads=2), 2 * 9 + 1, "lm"),
        # attention's 6, the router, the experts' two weight banks; lm_head
        "mixtral": (lambda: _lm(t.MixtralForCausalLM, t.MixtralConfig, num_key_value_heads=2, num_local_experts=4,
                                num_experts_per_tok=2), 2 * 9 + 1, "lm"),
        # query, key, value, scores, context, attention output, intermediate, output; head
        # transform and decoder
        "bert": (lambda: _lm(t.BertForMaskedLM, t.BertConfig), 2 * 8 + 2, "lm"),
        # the patch embedding conv; per block 8 as BERT's; the classifier
        "vit": (lambda: t.ViTForImageClassification(t.ViTConfig(hidden_size=32, num_attention_heads=4,
                                                                 num_hidden_layers=2, intermediate_size=64,
                                                                 patch_size=4, num_labels=5, **vision)),
                1 + 2 * 8 + 1, "image"),
        # embedder conv; stage 1: 2 basic blocks of 2 convs; stage 2: 2 blocks of 2 convs and
        # the shortcut's; the classifier
        "resnet": (lambda: t.ResNetForImageClassification(t.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[2, 2], layer_type="basic",
            num_labels=5)), 1 + 4 + 5 + 1, "image"),
        # encoder blocks: q, k, v, o, scores, context, wi, wo; decoder blocks: self-attention's
        # 6, cross-attention's 6, wi, wo; lm_head
        "t5": (lambda: t.T5ForConditionalGeneration(t.T5Config(
            vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            decoder_start_token_id=0, pad_token_id=0)), 2 * 8 + 2 * 14 + 1, "lm"),
        # the stem's conv, depthwise and projection (its expansion ratio is 1); 16 inverted
        # residual blocks of expansion, depthwise, projection; the last 1x1 conv; the classifier
        "mobilenet_v2": (lambda: t.MobileNetV2ForImageClassification(t.MobileNetV2Config(
            depth_multiplier=0.25, num_labels=5, **image32)), 3 + 16 * 3 + 1 + 1, "image32"),
        # the stem; 7 stages of one block each (depth 0.1): depthwise, squeeze-excite's two
        # convs, projection, and an expansion but in the first; the top conv; the classifier
        "efficientnet": (lambda: t.EfficientNetForImageClassification(t.EfficientNetConfig(
            width_coefficient=0.1, depth_coefficient=0.1, hidden_dim=128, num_labels=5, **image32)),
            1 + 4 + 6 * 5 + 1 + 1, "image32"),
        # the patchify conv; stage 1: one block of depthwise conv and two pointwise linears;
        # stage 2: the downsampling conv and one block; the classifier
        "convnext": (lambda: t.ConvNextForImageClassification(t.ConvNextConfig(
            num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5)),
            1 + 3 + 1 + 3 + 1, "image32"),
        # the patch embedding conv; per stage one block of q, k, v, scores, context, output,
        # the MLP's two; the patch merging between the stages; the classifier
        "swin": (lambda: t.SwinForImageClassification(t.SwinConfig(
            patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=5, **image32)),
            1 + 8 + 1 + 8 + 1, "image32"),
    }


@pytest.mark.parametrize("recipe", [MIXED, "mxfp8", "nvfp4"])
@pytest.mark.parametrize("name", list(_models()))
def test_transformers_models_train_with_every_product_quantized(name, recipe):
    make, layers, kind = _models()[name]
    torch.manual_seed(6)
    m = make()
    m.train()
    if kind == "lm":
        ids = torch.randint(0, 64, (2, 16))
        batch = dict(input_ids=ids, labels=ids)
    else:
        size = 32 if kind == "image32" else 16
        batch = dict(pixel_values=torch.randn(2, 3, size, size), labels=torch.tensor([1, 3]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no product may run float32 unsaid
        with ft.quantized(m, recipe):
            loss = m(**batch).loss
    loss.backward()
    st = ft.quant_state(m)
    assert torch.isfinite(loss)
    assert not st.unquantized, st.unquantized
    assert len(st.layers) == layers, list(st.layers)
    for layer, c in st.counts().items():
        assert c["a"]["total"] > 0 and c["gx"]["total"] > 0, (layer, c)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters() if p.requires_grad)


def _torchvision():
    """torchvision's models, where torchvision imports beside this torch (on these machines its
    PyPI wheel does not import beside the torch 2.13 CPU wheel)."""
    try:
        import torchvision
        return torchvision.models
    except Exception as e:  # ImportError, or RuntimeError "operator torchvision::nms does not exist"
        pytest.skip(f"torchvision does not import here: {e}")


# conv1, 8 basic blocks of 2 convs, 3 downsampling shortcuts, fc; features[0], 17 inverted
# residual blocks (the first without an expansion: 2 convs, the rest 3), features[18], the classifier
@pytest.mark.parametrize("name,products", [("resnet18", 1 + 16 + 3 + 1), ("mobilenet_v2", 1 + 2 + 16 * 3 + 1 + 1)])
def test_torchvision_models_train_with_every_product_quantized(name, products):
    models = _torchvision()
    torch.manual_seed(6)
    m = getattr(models, name)(num_classes=5)
    m.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with ft.quantized(m, "mxfp8"):
            loss = torch.nn.functional.cross_entropy(m(torch.randn(2, 3, 32, 32)), torch.tensor([1, 3]))
    loss.backward()
    st = ft.quant_state(m)
    assert torch.isfinite(loss) and not st.unquantized and len(st.layers) == products


def test_autocast_and_low_precision_models_quantize_from_float32():
    """Under torch.autocast a product's operands are quantized from float32 (bfloat16 values
    are exact there) and its result is rounded to autocast's dtype, as torch's product would
    be; a bfloat16 model alike. float64 stays float32-refused, with its reason."""
    torch.manual_seed(14)
    lin = torch.nn.Linear(8, 6)
    x = torch.randn(4, 8)
    recipe = f"a={A},w={W},gx=1.5.2:33,gw=1.5.2:31,first=false"
    ref = torch.nn.Linear(8, 6)
    ref.load_state_dict(lin.state_dict())
    with ft.quantized(ref, recipe):
        want = ref(x)
    with torch.autocast("cpu", dtype=torch.bfloat16), ft.quantized(lin, recipe):
        got = lin(x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16))
    got.float().sum().backward()
    assert lin.weight.grad.dtype == torch.float32 and torch.isfinite(lin.weight.grad).all()

    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for model in (net, ft.quantize_model(copy.deepcopy(net), recipe)):  # both paths
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if model is net:
                with ft.quantized(model, recipe):
                    y = model(x)
            else:
                y = model(x)
        y.float().square().sum().backward()
        st = ft.quant_state(model)
        assert y.dtype == torch.bfloat16 and len(st.layers) == 2 and not st.unquantized
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())

    low = torch.nn.Linear(8, 6).to(torch.bfloat16)
    with ft.quantized(low, recipe):
        y = low(x.to(torch.bfloat16))
    up = torch.nn.Linear(8, 6)
    up.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    with ft.quantized(up, recipe):
        want = up(x.to(torch.bfloat16).float())
    assert y.dtype == torch.bfloat16 and torch.equal(y, want.to(torch.bfloat16))
    y.float().sum().backward()
    assert low.weight.grad.dtype == torch.bfloat16

    with pytest.raises(TypeError, match="operands of bfloat16 and float32"):
        ft.linear(x.to(torch.bfloat16), lin.weight, None, ft.layer("l"))


def _held_out():
    """Architectures the hand-counted tests above never saw: each must train with every
    product quantized or reported (nothing silently float32)."""
    t = transformers
    lm = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
              max_position_embeddings=40)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    text = dict(input_ids=ids, labels=ids)
    return {
        "qwen2": (lambda: t.Qwen2ForCausalLM(t.Qwen2Config(num_key_value_heads=2, **lm)), text),
        "gemma": (lambda: t.GemmaForCausalLM(t.GemmaConfig(num_key_value_heads=2, head_dim=8, **lm)), text),
        "phi": (lambda: t.PhiForCausalLM(t.PhiConfig(**lm)), text),
        "roberta": (lambda: t.RobertaForMaskedLM(t.RobertaConfig(**lm)), text),
        "distilbert": (lambda: t.DistilBertForMaskedLM(t.DistilBertConfig(
            vocab_size=64, dim=32, n_heads=4, n_layers=2, hidden_dim=64, max_position_embeddings=32)), text),
        # conv feature encoder, a weight-normed grouped positional conv, masked assignment in place
        "wav2vec2": (lambda: t.Wav2Vec2ForCTC(t.Wav2Vec2Config(
            vocab_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4)),
            dict(input_values=torch.randn(2, 400), labels=torch.randint(1, 16, (2, 5)))),
        "segformer": (lambda: t.SegformerForImageClassification(t.SegformerConfig(
            num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
            patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], num_labels=5)),
            dict(pixel_values=torch.randn(2, 3, 32, 32), labels=torch.tensor([1, 3]))),
    }


@pytest.mark.parametrize("name", list(_held_out()))
def test_held_out_architectures_train_with_every_product_quantized_or_reported(name):
    make, batch = _held_out()[name]
    torch.manual_seed(7)
    m = make()
    m.train()
    with ft.quantized(m, "mxfp8"):
        loss = m(**batch).loss
    loss.backward()
    st = ft.quant_state(m)
    assert torch.isfinite(loss) and len(st.layers) > 0
    assert not st.unquantized, st.unquantized
    assert all(c["a"]["total"] > 0 for c in st.counts().values())


def test_a_linear_output_can_be_changed_in_place_as_torchs_can():
    """torch's linear of a 3-d input with a bias is a view; fp8lab's product must allow the
    in-place ops torch's output allows (wav2vec2 assigns into it through a mask)."""
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 5, 4, requires_grad=True)
    for model in (ft.quantize_model(copy.deepcopy(torch.nn.Sequential(lin)), MIXED), torch.nn.Sequential(lin)):
        if isinstance(model[0], ft.QuantLinear):
            y = model(x)
        else:
            with ft.quantized(model, MIXED):
                y = model(x)
        y[:, 0] = 0.0
        y.sum().backward()
        assert torch.isfinite(x.grad).all()
