"""fp8lab.torch: quantized ops, modules, quantize_model, loss scaling and the results store.

The ops are checked against the composition of torch's own float32 ops with
fp8lab.quantize (docs/spec.md §4), quantize_model against the C++ library's quantize_model
on the same weights and inputs (tests/python/cpp_reference.cpp), and the float32 path
against torch's own layers.
"""
import copy
import json
import re
import subprocess
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fp8lab
import fp8lab.torch as ft
from conftest import BUILD, REPO, same

A, W, GX, GW = "1.4.3:10", "1.4.3:14", "1.5.2:24", "1.5.2:33"


def q(t, fmt, layer=None, kind=None, operand=0, call=0):
    """Q(t) as the layer quantizes it: stochastic rounding draws the layer's stream."""
    name, _, rounding = fmt.partition("/")
    seed = layer.seed_for(kind, call, operand) if rounding == "stochastic" else 0
    return fp8lab.quantize(t.detach().contiguous(), name, rounding=rounding or "nearest-even", seed=seed)


@pytest.mark.parametrize("sr", ["", "/stochastic"])
def test_linear_is_the_composition_of_torch_and_quantize(sr):
    torch.manual_seed(0)
    lay = ft.layer("fc", a=A + sr, w=W + sr, gx=GX + sr, gw=GW + sr)
    x = torch.randn(6, 5, 32, requires_grad=True)
    w = (torch.randn(24, 32) * 0.1).requires_grad_()
    b = torch.randn(24, requires_grad=True)
    g = torch.randn(6, 5, 24) * 1e-3
    y = ft.linear(x, w, b, lay)
    y.backward(g)
    xq, wq = q(x, A + sr, lay, "a"), q(w, W + sr, lay, "w")
    same(y, F.linear(xq, wq, b.detach()))
    gq = q(g, GX + sr, lay, "gx")
    same(x.grad, gq.reshape(-1, 24).mm(wq).reshape(6, 5, 32))
    same(w.grad, q(xq.reshape(-1, 32).t().mm(gq.reshape(-1, 24)).t().contiguous(), GW + sr, lay, "gw"))
    same(b.grad, g.reshape(-1, 24).sum(0))
    c = lay.counts()
    assert c["a"]["total"] == x.numel() and c["gw"]["total"] == w.numel()


def _unit_values(t, fmt):
    """NVFP4's operand for a product that applies the tensor scale to its output
    (docs/spec.md §6.7): the codes of fp8lab's portable torch quantizer (an implementation
    independent of the C++ kernels) decoded under a tensor scale of 1, and the tensor scale."""
    c = fp8lab.encode(t.detach().contiguous(), fmt, backend="torch")
    ts = c.tensor_scale
    c.tensor_scale = 1.0
    return fp8lab.decode(c, backend="torch"), np.float32(ts)


def test_nvfp4_tensor_scales_multiply_the_products_output():
    torch.manual_seed(1)
    assert fp8lab.ScaledFormat("nvfp4").tensor_scale_on_output
    assert not fp8lab.ScaledFormat("nvfp4:tensor-scale-folded").tensor_scale_on_output
    x = torch.randn(5, 48) * 3
    w = torch.randn(24, 48) * 0.1
    b = torch.randn(24)
    xu, tx = _unit_values(x, "nvfp4")
    wu, tw = _unit_values(w, "nvfp4")
    y = ft.linear(x, w, b, ft.layer("fc", a="nvfp4", w="nvfp4"))
    same(y, F.linear(xu, wu).mul_(float(tx * tw)).add_(b))
    # Folded into the values: the fake-quantized operands' product.
    folded = "nvfp4:tensor-scale-folded"
    y = ft.linear(x, w, b, ft.layer("fc", a=folded, w=folded))
    same(y, F.linear(fp8lab.quantize(x, folded), fp8lab.quantize(w, folded), b))


@pytest.mark.parametrize("geometry", [dict(stride=1, padding=1, dilation=1, groups=1),
                                      dict(stride=2, padding=0, dilation=2, groups=2),
                                      dict(stride=1, padding=1, dilation=1, groups=8)])
def test_conv2d_is_the_composition_of_torch_and_quantize(geometry):
    torch.manual_seed(1)
    lay = ft.layer("conv", a=A, w=W, gx=GX, gw=GW)
    cin = 8
    x = torch.randn(2, cin, 9, 9, requires_grad=True)
    w = (torch.randn(8, cin // geometry["groups"], 3, 3) * 0.2).requires_grad_()
    b = torch.randn(8, requires_grad=True)
    y = ft.conv2d(x, w, b, lay, **geometry)
    g = torch.randn_like(y) * 1e-3
    y.backward(g)
    xq, wq, gq = q(x, A), q(w, W), q(g, GX)
    xr = xq.clone().requires_grad_()
    wr = wq.clone().requires_grad_()
    yr = F.conv2d(xr, wr, b.detach(), **geometry)
    same(y, yr)
    yr.backward(gq)
    same(x.grad, xr.grad)
    same(w.grad, q(wr.grad, GW))
    br = b.detach().clone().requires_grad_()  # libtorch's bias reduction of the float32 gradient
    F.conv2d(xq, wq, br, **geometry).backward(g)
    same(b.grad, br.grad)


def test_matmul_quantizes_both_operands_as_activations():
    torch.manual_seed(2)
    lay = ft.layer("scores", a=A + "/stochastic", gx=GX + "/stochastic")
    a = torch.randn(4, 7, 16, requires_grad=True)
    b = torch.randn(4, 16, 9, requires_grad=True)
    y = ft.matmul(a, b, lay)
    g = torch.randn(4, 7, 9) * 1e-2
    y.backward(g)
    aq, bq = q(a, A + "/stochastic", lay, "a", 0), q(b, A + "/stochastic", lay, "a", 1)
    same(y, torch.matmul(aq, bq))
    gq = q(g, GX + "/stochastic", lay, "gx")
    same(a.grad, torch.matmul(gq, bq.transpose(1, 2)))
    same(b.grad, torch.matmul(aq.transpose(1, 2), gq))


def test_float32_layers_equal_torch_bit_for_bit():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 5))
    ref = torch.nn.Sequential(*[m for m in model])  # the same parameter tensors
    x = torch.randn(4, 3, 6, 6)
    y_ref = ref(x)
    y_ref.sum().backward()
    grads = [p.grad.clone() for p in ref.parameters()]
    model.zero_grad()
    qm = ft.quantize_model(model, "fp32")
    y = qm(x)
    y.sum().backward()
    same(y, y_ref)
    for p, g in zip(qm.parameters(), grads):
        same(p.grad, g)


@pytest.mark.filterwarnings("ignore:Input #:UserWarning")
def test_gradcheck_with_float32_quantizers():
    lay = ft.layer("l")  # every kind float32: the ops are differentiable exactly
    x = torch.randn(3, 5, dtype=torch.float32, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    # gradcheck needs float64, which fp8lab does not take: compare the analytic gradients
    # with central differences in float32 at a tolerance for float32 rounding.
    assert torch.autograd.gradcheck(lambda x, w, b: ft.linear(x, w, b, lay), (x, w, b), eps=1e-2, atol=1e-2,
                                    rtol=1e-2, check_undefined_grad=False)
    xc = torch.randn(1, 2, 5, 5, requires_grad=True)
    wc = torch.randn(3, 2, 3, 3, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: ft.conv2d(x, w, None, lay, padding=1), (xc, wc), eps=1e-2,
                                    atol=2e-2, rtol=1e-2, check_undefined_grad=False)
    a = torch.randn(2, 3, 4, requires_grad=True)
    bm = torch.randn(2, 4, 3, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ft.matmul(a, b, lay), (a, bm), eps=1e-2, atol=1e-2, rtol=1e-2,
                                    check_undefined_grad=False)


# ---- quantize_model against the C++ library -----------------------------------------------

def cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=2), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))


@pytest.mark.parametrize("recipe", ["resnet32-152",
                                    "a=1.4.3:10/stochastic,w=1.4.3:14,gx=1.5.2:24/stochastic,gw=1.5.2:33/stochastic",
                                    "mxfp8", "efficientnet-mixed"])  # the last: first layer in float16
def test_quantize_model_equals_the_cpp_library(tmp_path, recipe):
    torch.manual_seed(4)
    model = cnn()
    for i in (0, 2, 5, 7):
        np.save(tmp_path / f"p{i}w.npy", model[i].weight.detach().numpy())
        np.save(tmp_path / f"p{i}b.npy", model[i].bias.detach().numpy())
    steps = 3
    for k in range(steps):
        np.save(tmp_path / f"x{k}.npy", torch.randn(4, 1, 8, 8).numpy())
        np.save(tmp_path / f"r{k}.npy", torch.randn(4, 10).numpy())
    subprocess.run([str(BUILD / "fp8lab_python_reference"), str(tmp_path), recipe, "11", str(steps), "fp32"],
                   check=True)
    qm = ft.quantize_model(model, recipe, seed=11)
    for k in range(steps):
        x = torch.from_numpy(np.load(tmp_path / f"x{k}.npy")).requires_grad_()
        y = qm(x)
        (y * torch.from_numpy(np.load(tmp_path / f"r{k}.npy"))).sum().backward()
        same(y.detach(), torch.from_numpy(np.load(tmp_path / f"y{k}.npy")))
        same(x.grad, torch.from_numpy(np.load(tmp_path / f"gx{k}.npy")))
        for i in (0, 2, 5, 7):
            same(qm[i].weight.grad, torch.from_numpy(np.load(tmp_path / f"p{i}w_g{k}.npy")))
            same(qm[i].bias.grad, torch.from_numpy(np.load(tmp_path / f"p{i}b_g{k}.npy")))
        qm.zero_grad()
    assert ft.quant_state(qm).step == steps


# ---- quantize_model on arbitrary module trees ------------------------------------------------

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.conv = torch.nn.Conv2d(2, 2, 3, padding="same", padding_mode="reflect")

    def forward(self, x):
        return self.proj(x)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.rnn = torch.nn.GRU(16, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = torch.relu(b(h))
        return self.head(h)


def test_quantize_model_replaces_every_layer_by_qualified_name(tmp_path):
    net = Net()
    params = {n: p for n, p in net.named_parameters()}
    opt = torch.optim.SGD(net.parameters(), lr=0.1)  # built before: must keep working
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "mine"\na = "1.4.3"\nw = "1.4.3"\ngx = "1.5.2"\n'
                      '[[override]]\nmatch = "blocks.1.*"\nw = "1.5.2:20"\n'
                      '[[override]]\nmatch = "last"\na = "fp32"\nw = "fp32"\n')
    qm = ft.quantize_model(net, str(recipe))
    st = ft.quant_state(qm)
    assert list(st.layers) == ["embed", "blocks.0.proj", "blocks.0.conv", "blocks.1.proj", "blocks.1.conv", "head"]
    assert st.quantizers()["blocks.1.proj"]["w"] == "1.5.2:20"
    assert st.quantizers()["blocks.0.proj"]["w"] == "1.4.3"
    assert st.quantizers()["head"]["w"] == "fp32"
    assert st.quantizers()["embed"]["a"] == "fp32"  # the first layer's input stays float32
    assert ("rnn", "GRU has no quantized op") in st.skipped
    assert isinstance(qm.blocks[0].proj, ft.QuantLinear)
    assert {n: p for n, p in qm.named_parameters()} == params  # the same tensors, the same names
    assert set(qm.state_dict()) == set(Net().state_dict())
    x = torch.randn(5, 8)
    qm(x).sum().backward()
    before = qm.head.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, qm.head.weight)
    y = qm.blocks[0].conv(torch.randn(1, 2, 5, 5))  # padding 'same' with reflection
    assert y.shape == (1, 2, 5, 5)
    with pytest.raises(ValueError, match="nomatch"):
        bad = tmp_path / "bad.toml"
        bad.write_text('a = "1.4.3"\n[[override]]\nmatch = "nomatch.*"\nw = "fp32"\n')
        ft.quantize_model(Net(), str(bad))


def test_quantize_model_reflect_and_same_padding_match_torch():
    torch.manual_seed(5)
    conv = torch.nn.Conv2d(2, 3, 3, padding="same", padding_mode="reflect")
    x = torch.randn(1, 2, 6, 6)
    want = conv(x)
    m = ft.quantize_model(torch.nn.Sequential(conv), "fp32")
    same(m(x), want)


class Attention(torch.nn.Module):
    """Attention written with torch.matmul and @, as users write it."""

    def __init__(self, d=16):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.scale = torch.nn.Parameter(torch.ones(d, d))

    def forward(self, x):
        qkv = self.qkv(x)
        d = qkv.shape[-1] // 3
        q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        a = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / 4.0, dim=-1)
        h = (a @ v) @ self.scale  # the last product has a parameter: stays float32
        return self.out(h)


def test_traced_matmuls_become_quantized_and_params_are_reported():
    torch.manual_seed(6)
    m = Attention()
    x = torch.randn(2, 5, 16)
    want = m(x)
    qm = ft.quantize_model(m, "fp32")
    st = ft.quant_state(qm)
    assert [p for p in st.layers if "matmul" in p] == ["matmul", "matmul_1"]
    assert any("parameter" in why for _, why in st.skipped)
    same(qm(x), want)  # float32 quantizers: torch's own result
    qm8 = ft.quantize_model(Attention(), "a=1.4.3,w=1.4.3,gx=1.5.2")
    qm8(x).sum().backward()
    assert ft.quant_state(qm8).counts()["matmul"]["a"]["total"] == 2 * (2 * 5 * 16)


class Untraceable(Attention):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
            x = x * 2
        return super().forward(x)


def test_models_that_do_not_trace_say_so():
    with pytest.warns(UserWarning, match="stay float32"):
        qm = ft.quantize_model(Untraceable(), "a=1.4.3,w=1.4.3")
    st = ft.quant_state(qm)
    assert "not traced" in st.traced
    assert list(st.layers) == ["qkv", "out"]
    with pytest.raises(ValueError, match="does not trace"):
        ft.quantize_model(Untraceable(), "fp32", trace="require")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no products of activations: nothing to warn of
        st = ft.quant_state(ft.quantize_model(UntraceableWithoutProducts(), "a=1.4.3,w=1.4.3"))
    assert "not traced" in st.traced and list(st.layers) == ["fc"]


class UntraceableWithoutProducts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            x = x * 2
        return self.fc(x)


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention_equals_torch_in_float32(batch_first):
    torch.manual_seed(7)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=batch_first)
    x = torch.randn(5, 3, 16) if not batch_first else torch.randn(3, 5, 16)
    mem = torch.randn(7, 3, 16) if not batch_first else torch.randn(3, 7, 16)
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, -2:] = True
    want_self, w_self = mha(x, x, x, attn_mask=causal)
    want_cross, _ = mha(x, mem, mem, key_padding_mask=pad)
    model = torch.nn.Sequential(mha)
    qm = ft.quantize_model(model, "fp32")
    got_self, g_self = qm[0](x, x, x, attn_mask=causal)
    got_cross, _ = qm[0](x, mem, mem, key_padding_mask=pad)
    torch.testing.assert_close(got_self, want_self, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_self, w_self, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_cross, want_cross, rtol=1e-5, atol=1e-6)
    # torch 2.x's is_causal hint (what nn.TransformerEncoderLayer passes): with the causal
    # mask as torch takes it, and without a mask, where the quantized layer makes the mask.
    want_hint, _ = mha(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)
    torch.testing.assert_close(qm[0](x, x, x, attn_mask=causal, is_causal=True)[0], want_hint, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(qm[0](x, x, x, is_causal=True)[0], want_hint, rtol=1e-5, atol=1e-6)
    assert list(ft.quant_state(qm).layers) == ["0.in_proj", "0.scores", "0.context", "0.out_proj"]


def test_multihead_attention_quantized_counts_every_product():
    torch.manual_seed(10)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 1)
    x = torch.randn(2, 6, 16)
    enc.eval()
    with torch.no_grad():
        plain = enc(x)
    qm = ft.quantize_model(torch.nn.Sequential(enc), "a=1.4.3,w=1.4.3,gx=1.5.2,first=0")
    qm.eval()
    with torch.no_grad():  # libtorch's fused inference path must not bypass the quantizers
        assert not torch.allclose(qm(x), plain, atol=1e-3)
    qm.train()
    qm(x).sum().backward()
    c = ft.quant_state(qm).counts()
    assert c["0.layers.0.self_attn.scores"]["a"]["total"] == 2 * (2 * 4 * 6 * 4)
    assert c["0.layers.0.self_attn.in_proj"]["w"]["total"] == 3 * 16 * 16
    assert c["0.layers.0.linear1"]["gx"]["total"] == 2 * 6 * 32


# ---- steps, evaluation, statistics ------------------------------------------------------------

def test_steps_advance_in_training_and_evaluation_leaves_them_alone():
    torch.manual_seed(8)
    qm = ft.quantize_model(cnn(), "a=1.4.3/stochastic,w=1.4.3/stochastic,first=0", stats_interval=2)
    st = ft.quant_state(qm)
    x = torch.randn(2, 1, 8, 8)
    y0 = qm(x)
    y1 = qm(x)
    assert not torch.equal(y0, y1)  # fresh streams at each step
    assert st.step == 2
    recs = st.stats()
    assert {r["step"] for r in recs} == {0}  # every second step
    assert {r["layer"] for r in recs} == {"0", "2", "5", "7"}
    qm.eval()
    e0 = qm(x)
    assert st.step == 2 and st.stats() == []  # evaluation neither advances nor records
    qm.train()
    st.step = 1
    same(qm(x), y1)  # the same step draws the same streams
    qm.eval()
    same(qm(x), e0)  # each evaluation starts from the same streams
    qm.train()
    h = recs[0]["histogram"]
    assert sum(h["counts"]) + h["zero"] > 0


def test_loss_scaler_is_used_like_grad_scaler():
    torch.manual_seed(9)
    model = ft.quantize_model(cnn(), "a=1.4.3,w=1.4.3,gx=1.5.2:15/rne/nan,gw=1.5.2")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = ft.LossScaler("backoff:init=40,interval=2", recipe="a=1.4.3,w=1.4.3,gx=1.5.2:15/rne/nan,gw=1.5.2")
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    for _ in range(12):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        before = model[7].weight.detach().clone()
        scaler.step(opt)
        assert torch.equal(before, model[7].weight) == scaler.last["skipped"]  # a skipped step changes nothing
        scaler.update()
    assert scaler.skipped_steps > 0  # 2^40 overflows the gradient format
    assert scaler.get_scale() < 2.0 ** 40
    assert [t[2] for t in scaler.trace].count(True) == scaler.skipped_steps
    state = scaler.state_dict()
    other = ft.LossScaler("backoff:init=40,interval=2")
    other.load_state_dict(state)
    assert other.get_scale() == scaler.get_scale()
    with pytest.raises(RuntimeError):
        scaler.update()


def test_logmax_aims_at_the_recipe_gradient_format():
    s = ft.LossScaler("logmax:c=1", recipe="a=1.4.3,w=1.4.3,gx=1.5.2:24,gw=fp32")
    assert s._core.target_max == fp8lab.Format("1.5.2:24").max
    with pytest.warns(UserWarning, match="saturates"):
        ft.LossScaler("backoff", recipe="a=1.4.3,gx=1.5.2")


def test_runs_land_in_the_results_store(tmp_path, cli):
    db = tmp_path / "r.db"
    qm = ft.quantize_model(cnn(), "resnet32-152", stats_interval=1)
    scaler = ft.LossScaler("static:4")
    opt = torch.optim.SGD(qm.parameters(), lr=0.01)
    with ft.RunRecorder(db, "python-cnn", model=qm, scaler=scaler, seed=3, config={"lr": 0.01}) as run:
        for step in range(3):
            opt.zero_grad()
            loss = qm(torch.randn(2, 1, 8, 8)).square().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            run.log(step + 1, loss=loss.item())
        run.finish(0.5, "test_accuracy")
    rows = json.loads(cli("runs", "--db", db, "--json"))
    assert len(rows) == 1
    r = rows[0]
    assert (r["name"], r["status"], r["recipe"], r["final_metric"]) == ("python-cnn", "finished", "resnet32-152", 0.5)
    # The processor it ran on ("unknown CPU" where /proc/cpuinfo names none); the same below
    # through the binding.
    assert r["machine"]
    report = cli("report", "--name", "python-cnn", "--db", db, "--out", tmp_path / "report")
    assert "| resnet32-152 | static:4 |" in report and "0.50" in report, report
    assert (tmp_path / "report" / "table.md").exists()
    store = fp8lab._core.Store(str(db))
    assert [v for _, v in store.metric(run.id, "loss")] and len(store.loss_scale_trace(run.id)) == 3
    assert {s.layer for s in store.stats(run.id)} == {"0", "2", "5", "7"}
    with pytest.raises(ZeroDivisionError):
        with ft.RunRecorder(db, "broken") as run2:
            1 / 0
    assert store.runs(name="broken")[0]["status"] == "failed"
    assert store.runs(name="python-cnn")[0]["machine"] == r["machine"]


def test_a_module_used_twice_is_quantized_at_every_use():
    lin = torch.nn.Linear(6, 6)
    seq = torch.nn.Sequential(lin, torch.nn.ReLU(), lin, torch.nn.Sequential(lin))
    qm = ft.quantize_model(seq, "a=1.4.3,w=1.4.3,gx=1.5.2,gw=1.5.2")
    assert isinstance(qm[0], ft.QuantLinear)
    assert qm[2] is qm[0] and qm[3][0] is qm[0]  # one conversion in every place: weights shared
    assert qm[0].weight is lin.weight
    st = ft.quant_state(qm)
    assert list(st.layers) == ["0"]
    assert not st.skipped
    # One layer, the first: its input stays float32 (the recipe's exempt_first) at every use.
    assert st.quantizers()["0"]["a"] == "fp32"
    x = torch.randn(3, 6)
    w, b = q(lin.weight, "1.4.3"), lin.bias
    same(qm(x), F.linear(F.linear(torch.relu(F.linear(x, w, b)), w, b), w, b))


@pytest.mark.parametrize("shape", [(0, 4), (4, 0)])
def test_layers_without_inputs_or_outputs_run_as_torch_does(shape):
    torch.manual_seed(0)
    ref = torch.nn.Linear(*shape)
    qm = ft.quantize_model(torch.nn.Sequential(copy.deepcopy(ref)), "a=1.4.3,w=1.4.3,gx=1.5.2,gw=1.5.2")
    x = torch.randn(3, shape[0], requires_grad=True)
    y = qm(x)
    same(y, ref(x))  # no input features: the bias alone; no outputs: an empty result
    y.sum().backward()
    assert x.grad.shape == x.shape and qm[0].weight.grad.shape == ref.weight.shape
    ref(x).sum().backward()
    same(qm[0].bias.grad, ref.bias.grad)  # a bias of no elements has its gradient of none, as in torch


def test_codes_outside_their_format_are_refused():
    with pytest.raises(ValueError, match="value 255 at index 2 is not a 4-bit code"):
        fp8lab.decode(torch.tensor([1, 2, 255], dtype=torch.uint8), "e2m1fn")
    assert fp8lab.decode(torch.tensor([1, 2, 15], dtype=torch.uint8), "e2m1fn").shape == (3,)


def test_errors_are_python_exceptions():
    lay = ft.layer("l", a="1.4.3")
    with pytest.raises(TypeError, match="float32"):
        ft.linear(torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3), None, lay)
    with pytest.raises(TypeError, match="CPU"):
        ft.linear(torch.empty(2, 3, device="meta"), torch.randn(4, 3), None, lay)
    with pytest.raises(ValueError, match="recipe|format|'nonsense'"):
        ft.quantize_model(cnn(), "nonsense")
    with pytest.raises(TypeError, match="torch.nn.Module, got int"):
        ft.quantize_model(42, "fp32")
    with pytest.raises(ValueError):
        ft.layer("l", a="1.9.9")
    with pytest.raises(ValueError, match="already"):
        m = ft.quantize_model(cnn(), "fp32")
        ft.quantize_model(m, "fp32")
    with pytest.raises(ValueError):  # shapes that do not fit: libtorch's message, not a crash
        ft.linear(torch.randn(2, 3), torch.randn(4, 5), None, lay)
    # Inputs that do not fit a converted layer: a ValueError naming the layer, quantized or exempt.
    qm = ft.quantize_model(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                               torch.nn.Linear(4 * 6 * 6, 5), torch.nn.Linear(5, 2)),
                           "a=1.4.3,w=1.4.3,gx=1.5.2,gw=1.5.2")
    with pytest.raises(ValueError, match=r"QuantConv2d '0': expected an input \[N, 3, H, W\]"):
        qm(torch.randn(1, 2, 8, 8))
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        qm(torch.randn(1, 3, 2, 2))
    with pytest.raises(ValueError, match="QuantLinear '2': the input's last dimension is 7, the layer takes 144"):
        qm[2](torch.randn(2, 7))
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    for kwargs, error, text in [({"stride": 0}, ValueError, "stride=0: each must be at least 1"),
                                ({"padding": -1}, ValueError, "padding=-1"),
                                ({"dilation": (1, 0)}, ValueError, "dilation"),
                                ({"groups": 0}, ValueError, "groups=0"),
                                ({"stride": "2"}, TypeError, "stride='2'"),
                                ({"padding": (1, 2, 3)}, TypeError, "padding")]:
        with pytest.raises(error, match=re.escape(text)):
            ft.conv2d(x, w, None, lay, **kwargs)


def test_arguments_beat_the_recipe_file_which_beats_the_default():
    # The precedence of `fp8lab train` (docs/spec.md §4.2), for each source of a value.
    recipe = str(REPO / "configs/recipes/deepseek-v3.toml")  # compute auto, accumulate 1.8.13@128
    ctx = lambda m: ft.quant_state(m).context
    from_file = ctx(ft.quantize_model(cnn(), recipe))
    assert (from_file.compute, from_file.accumulate) == ("auto", "1.8.13@128")
    given = ctx(ft.quantize_model(cnn(), recipe, compute="fp32", accumulate="fp32"))
    assert (given.compute, given.accumulate) == ("fp32", "fp32")
    default = ctx(ft.quantize_model(cnn(), "fp32"))
    assert (default.compute, default.accumulate) == ("fp32", "fp32")


def test_quantized_models_copy_and_pickle():
    import copy
    import io
    torch.manual_seed(11)
    m = ft.quantize_model(cnn(), "a=1.4.3/stochastic,w=1.4.3,gx=1.5.2", seed=5)
    x = torch.randn(2, 1, 8, 8)
    m(x)
    c = copy.deepcopy(m)
    st, sc = ft.quant_state(m), ft.quant_state(c)
    assert sc.context is not st.context and sc.context.seed == 5
    assert all(l.context is sc.context for l in sc.layers.values())  # one context, shared as before
    assert c[0].layer is sc.layers["0"]
    assert sc.quantizers() == st.quantizers() and sc.step == st.step
    same(c(x), m(x))  # the same step and streams: the same values
    assert st.step == 2 and sc.step == 2  # each copy steps on its own
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)  # a whole module, not a state dict
    assert ft.quant_state(loaded).quantizers() == st.quantizers()
    same(loaded(x), c(x))
    # A traced model (a GraphModule) keeps its state through copies and pickling too.
    a = ft.quantize_model(Attention(), "a=1.4.3/stochastic,w=1.4.3")
    xa = torch.randn(2, 5, 16)
    a(xa)
    copies = (copy.deepcopy(a), torch.load(io.BytesIO(_saved(a)), weights_only=False))
    ref = a(xa)  # step 1
    for other in copies:
        so = ft.quant_state(other)
        assert so.step == 1 and "matmul" in so.layers and so.layers["matmul"].context is so.context
        assert other.matmul.layer is so.layers["matmul"]
        same(other(xa), ref)  # the same step and streams as the original
        assert so.step == 2


def _saved(m):
    import io
    buf = io.BytesIO()
    torch.save(m, buf)
    return buf.getvalue()


class MyLinear(torch.nn.Linear):
    """A subclass that changes nothing of the computation."""


class OwnLinear(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def test_conversion_keeps_subclasses_hooks_and_parametrizations():
    torch.manual_seed(12)
    seen = []
    m = torch.nn.Sequential(MyLinear(4, 4), OwnLinear(4, 4),
                            torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 4)),
                            torch.nn.utils.weight_norm(torch.nn.Linear(4, 4)))
    hook = m[0].register_forward_hook(lambda mod, args, out: seen.append(tuple(out.shape)))
    pre = m[0].register_forward_pre_hook(lambda mod, args: seen.append("pre"))
    params = dict(m.named_parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.nn.utils.weight_norm is deprecated
        qm = ft.quantize_model(m, f"a={A},w={W},gx={GX},gw={GW}")
        st = ft.quant_state(qm)
        assert isinstance(qm[0], ft.QuantLinear) and "0" in st.layers  # MyLinear computes as Linear
        kept = dict(st.skipped)
        assert "its own code" in kept["1"]
        assert "parametrized weight (weight_norm, spectral_norm)" in kept["2"]
        assert "weight computed from weight_g, weight_v" in kept["3"]
        assert dict(qm.named_parameters()).keys() == params.keys()  # weight_norm's parameters stay
        qm(torch.randn(3, 4)).sum().backward()
    assert seen == ["pre", (3, 4)]  # the hooks registered before the conversion fire after it
    assert all(p.grad is not None for p in qm.parameters())
    hook.remove()
    pre.remove()
    qm(torch.randn(3, 4))
    assert seen == ["pre", (3, 4)]  # and their handles still remove them

    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 2, padding="same"))
    st = ft.quant_state(ft.quantize_model(conv, "fp32"))
    assert not st.layers and "even dilated kernel pads unevenly" in dict(st.skipped)["0"]  # said at conversion


def test_the_dispatch_path_names_a_parametrized_weight_by_its_module():
    torch.manual_seed(13)
    m = torch.nn.Sequential(torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 4)),
                            torch.nn.utils.parametrizations.spectral_norm(torch.nn.Conv2d(4, 2, 1)))
    with ft.quantized(m, f"a={A},w={W},gx={GX},gw={GW},first=false"):
        y = m[1](m[0](torch.randn(3, 4)).view(3, 4, 1, 1))
    y.sum().backward()
    st = ft.quant_state(m)
    assert list(st.layers) == ["0", "1"]
    assert st.quantizers()["0"]["w"] == W and st.counts()["0"]["w"]["total"] == 16
    # spectral_norm's power iteration (two mv products) computes the weight: float32, and said so
    assert st.unquantized and all("parametrized weight's computation" in why for _, why in st.unquantized.values())
    assert all(k.startswith("1.parametrizations.weight") for k in st.unquantized)


def test_jit_trace_of_a_quantized_model_is_refused_not_wrong():
    m = ft.quantize_model(torch.nn.Sequential(torch.nn.Linear(4, 4)), f"a={A},w={W},gx={GX},gw={GW}")
    with pytest.raises(RuntimeError, match="torch.jit.trace cannot record fp8lab's quantized products"):
        torch.jit.trace(m, torch.randn(2, 4))


def test_a_model_that_is_one_layer_and_a_held_transformer_convert():
    torch.manual_seed(15)
    lin = torch.nn.Linear(4, 3)
    q = ft.quantize_model(lin, f"a={A},w={W},gx={GX},gw={GW},first=false")
    assert isinstance(q, ft.QuantLinear) and q.weight is lin.weight and list(ft.quant_state(q).layers) == ["linear"]
    x = torch.randn(2, 4)
    same(q(x), F.linear(fp8lab.quantize(x, A), fp8lab.quantize(lin.weight.detach(), W), lin.bias))
    conv = ft.quantize_model(torch.nn.Conv2d(2, 2, 3), "resnet32-mixed")
    assert isinstance(conv, ft.QuantConv2d) and list(ft.quant_state(conv).layers) == ["conv"]
    mha = ft.quantize_model(torch.nn.MultiheadAttention(8, 2), "resnet32-mixed")
    assert isinstance(mha, ft.QuantMultiheadAttention) and len(ft.quant_state(mha).layers) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nn.Transformer's note on nested tensors
        held = torch.nn.Sequential(torch.nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1,
                                                        num_decoder_layers=1, dim_feedforward=16))
    st = ft.quant_state(ft.quantize_model(held, "resnet32-mixed", trace="off"))
    # encoder: attention's 4 and the MLP's 2; decoder: two attentions and the MLP
    assert len(st.layers) == 6 + 10 and not st.skipped


class ReadsItsChildsWeight(torch.nn.Module):
    """As torchvision's Swin does: the parent calls F.linear on a child Linear's weight."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.out(F.linear(x, self.qkv.weight, self.qkv.bias))


def test_converted_layers_a_parent_bypasses_are_named_after_the_first_step():
    m = ft.quantize_model(ReadsItsChildsWeight(), "resnet32-mixed")
    with pytest.warns(UserWarning, match=r"1 converted layers did not run in the first training forward \(qkv\)"):
        m(torch.randn(3, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        m(torch.randn(3, 4))  # said once
    assert ft.quant_state(m).counts()["qkv"]["w"]["total"] == 0
    net = ReadsItsChildsWeight()
    with ft.quantized(net, "resnet32-mixed"):  # the dispatch path quantizes the product
        net(torch.randn(3, 4))
    assert ft.quant_state(net).counts()["qkv"]["w"]["total"] == 16


@pytest.mark.parametrize("path", ["module", "dispatch"])
def test_torch_compile_gives_the_eager_bits(path):
    """torch.compile runs each quantized product eagerly (a graph break at each) and compiles
    the rest: outputs and gradients equal eager's bit for bit."""
    def run(compiled):
        torch.manual_seed(16)
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
        x = torch.randn(8, 16)
        if path == "module":
            m = ft.quantize_model(m, "nvfp4")
            f = torch.compile(m, backend="aot_eager") if compiled else m
            y = f(x)
        else:
            program = ft.quantized(m, "nvfp4")
            f = torch.compile(m, backend="aot_eager") if compiled else m
            with program:
                y = f(x)
        y.square().sum().backward()
        return y.detach(), [p.grad for p in m.parameters()], ft.quant_state(m)
    ye, ge, se = run(False)
    yc, gc, sc = run(True)
    same(yc, ye)
    for a, b in zip(gc, ge):
        same(a, b)
    assert list(sc.layers) == list(se.layers) and sc.counts() == se.counts()
