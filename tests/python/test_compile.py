"""torch.compile of quantized models (docs/python.md, "torch.compile"): fp8lab's products
trace as custom operators (python/fp8lab/torch/_compiled.py), so that a model converted by
quantize_model compiles to one graph, with no graph break, and trains to eager's bits.

Each test runs the same program eagerly and compiled and compares every output, gradient,
parameter and count bit for bit. The models keep to operations whose compiled code gives
eager's bits themselves (ReLU, additions, reshapes): inductor's own GELU or LayerNorm
differ from eager's in the last bits, which is torch's doing, not fp8lab's.
"""
import gc
import warnings

import pytest
import torch
import torch._dynamo

import fp8lab._core as core
import fp8lab.torch as ft
from conftest import same


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 8, 3, groups=8, stride=2), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 8, 1), torch.nn.Flatten(), torch.nn.Linear(8 * 2 * 2, 4))


class Attention(torch.nn.Module):
    """nn.MultiheadAttention (QuantMultiheadAttention once converted) and a matmul of two
    activations (a QuantMatmul after tracing)."""

    def __init__(self):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        a, _ = self.mha(x, x, x, need_weights=False)
        h = self.proj(a)
        return torch.relu(h @ x.transpose(1, 2)).flatten(1)


class Functional(torch.nn.Module):
    """fp8lab.torch's functional products, each with its own LayerState: a 1-d and a
    transposed 2-d convolution and a matmul."""

    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(6, 3, 3) / 3)
        self.w2 = torch.nn.Parameter(torch.randn(6, 4, 2, 2) / 3)
        self.l1, self.l2 = ft.layer("conv1d", w="nvfp4", a="nvfp4"), ft.layer("deconv", w="mxfp8_e4m3")
        self.l3 = ft.layer("matmul", a="1.4.3:10", gx="1.5.2:24/stochastic")

    def forward(self, x):
        h = torch.relu(ft.conv(x, self.w1, None, self.l1, padding=1))          # [N, 6, 8]
        h = ft.conv(h.view(-1, 6, 4, 2), self.w2, None, self.l2, stride=2, transposed=True)  # [N, 4, 8, 4]
        return ft.matmul(h, h.transpose(-1, -2), self.l3).flatten(1)


def inputs(model):
    shapes = {"mlp": (8, 16), "cnn": (2, 3, 6, 6), "attention": (2, 5, 16), "functional": (2, 3, 8)}
    return torch.randn(*shapes[model])


def make(model, recipe, **kw):
    if model == "functional":
        return Functional()  # its layers are its own
    net = {"mlp": mlp, "cnn": cnn, "attention": Attention}[model]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracing notes of Attention
        return ft.quantize_model(net, recipe, seed=5, **kw)


def train(model, recipe, compiled, backend="inductor", steps=3, **kw):
    """A few steps of SGD, each followed by an evaluation pass: the losses, the evaluation
    outputs, the parameters and the layers' counts."""
    torch.manual_seed(3)
    torch._dynamo.reset()
    m = make(model, recipe, **kw)
    f = torch.compile(m, backend=backend, fullgraph=True) if compiled else m
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    out = []
    for _ in range(steps):
        x = inputs(model)
        m.train()
        loss = f(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        m.eval()
        with torch.no_grad():
            out.append((loss.detach(), f(x)))
    counts = ft.quant_state(m).counts() if model != "functional" else [l.counts() for l in (m.l1, m.l2, m.l3)]
    return out, [p.detach().clone() for p in m.parameters()], counts


@pytest.mark.parametrize("model", ["mlp", "cnn", "attention", "functional"])
def test_a_quantized_model_compiles_to_one_graph(model):
    """fullgraph=True: a graph break would raise. The graph holds every product as an
    fp8lab operator."""
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    m = make(model, "nvfp4")
    y = torch.compile(m, backend=backend, fullgraph=True)(inputs(model))
    assert torch.isfinite(y).all()
    calls = [[str(n.target) for n in g.graph.nodes if n.op == "call_function"] for g in graphs]
    # A model traced by quantize_model is a torch.fx.GraphModule, whose hooks Dynamo
    # compiles apart from its forward: graphs of the step bookkeeping alone.
    with_products = [c for c in calls if c != ["fp8lab.state_event"]]
    assert len(graphs) == (3 if model == "attention" else 1) and len(with_products) == 1, calls
    products = [c for c in with_products[0] if c.startswith("fp8lab.") and c != "fp8lab.state_event"]
    layers = 3 if model == "functional" else len(ft.quant_state(m).layers)
    # MultiheadAttention: its input projection runs once (one product for q, k and v).
    assert len(products) == layers, products


@pytest.mark.parametrize("model,recipe,backend", [
    ("mlp", "nvfp4", "inductor"), ("mlp", "resnet32-mixed", "inductor"), ("mlp", "mxfp8", "aot_eager"),
    ("cnn", "nvfp4", "inductor"), ("cnn", "resnet32-mixed", "aot_eager"),
    ("attention", "nvfp4", "aot_eager"), ("attention", "transformer-mixed", "inductor"),
    ("functional", "-", "inductor"),
])
def test_compiled_training_gives_the_eager_bits(model, recipe, backend):
    eager, p_eager, c_eager = train(model, recipe, compiled=False)
    comp, p_comp, c_comp = train(model, recipe, compiled=True, backend=backend)
    for (le, ye), (lc, yc) in zip(eager, comp):
        same(lc, le)
        same(yc, ye)
    for a, b in zip(p_comp, p_eager):
        same(a, b)
    assert c_comp == c_eager


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_compiled_products_on_the_compute_layer_give_the_eager_bits(model):
    """compute="auto": products on AMX-BF16 where that is exact (the compute layer)."""
    eager, p_eager, c_eager = train(model, "mxfp8", compiled=False, compute="auto")
    comp, p_comp, c_comp = train(model, "mxfp8", compiled=True, compute="auto")
    for (le, ye), (lc, yc) in zip(eager, comp):
        same(lc, le)
        same(yc, ye)
    for a, b in zip(p_comp, p_eager):
        same(a, b)


def test_compiled_step_bookkeeping_runs_at_each_call():
    """The step advances once per compiled training call (stochastic-rounding streams follow
    it) and evaluation leaves it where it was, as eagerly."""
    torch._dynamo.reset()
    m = make("mlp", "nvfp4")
    f = torch.compile(m, backend="aot_eager", fullgraph=True)
    st = ft.quant_state(m)
    for i in range(3):
        f(inputs("mlp"))
        assert st.step == i + 1 and st.context.step == i
    m.eval()
    with torch.no_grad():
        f(inputs("mlp"))
    assert st.step == 3 and st.context.step == 2 and st.context.recording


def test_a_split_forward_keeps_its_state_as_long_as_its_handle():
    """The C++ products split in two (what the custom operators call): the handle owns what
    backward needs, and a backward given a handle that is gone, or no handle, is refused."""
    layer = ft.layer("split", a="nvfp4", w="nvfp4", gx="nvfp4")
    x = torch.randn(4, 32, requires_grad=True)
    w = torch.randn(8, 32, requires_grad=True)
    y_ref = ft.linear(x, w, None, ft.layer("split", a="nvfp4", w="nvfp4", gx="nvfp4"))
    y_ref.backward(torch.ones_like(y_ref))
    y, handle = core.quant_linear_forward(x.detach(), w.detach(), None, layer)
    same(y, y_ref.detach())
    dx, dw, db = core.quant_backward(torch.ones_like(y), handle, [True, True, False])
    same(dx, x.grad)
    same(dw, w.grad)
    assert db is None
    kept = handle.clone()
    del handle
    gc.collect()
    with pytest.raises(core.Error, match="no saved forward for this handle"):
        core.quant_backward(torch.ones_like(y), kept, [True, True, False])
    with pytest.raises(core.Error, match="0-d int64 tensor"):
        core.quant_backward(torch.ones_like(y), torch.zeros(1), [True, True, False])
    y, handle = core.quant_linear_forward(x.detach(), w.detach(), None, layer)
    with pytest.raises(core.Error, match="2 gradient flags for a product of 3 tensor inputs"):
        core.quant_backward(torch.ones_like(y), handle, [True, True])


def test_the_operators_refuse_what_they_were_not_made_for():
    """Called by hand: a layer key that names no live LayerState, an event a QuantState does
    not have, a key asked for something that is not a LayerState."""
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="names key 987654321, whose LayerState or QuantState is gone"):
        torch.ops.fp8lab.linear(x, w, None, 987654321)
    m = make("mlp", "nvfp4")
    with pytest.raises(ValueError, match="no event 'jump'"):
        ft.quant_state(m)._event("jump", None)
    from fp8lab.torch import _compiled
    with pytest.raises(TypeError, match="expected a LayerState, got str"):
        _compiled.key_of("fc1")
