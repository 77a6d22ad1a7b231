"""quantize_model: a user's torch.nn.Module trained with a recipe's quantizers.

Every torch.nn.Linear and Conv2d anywhere in the module tree becomes a QuantLinear /
QuantConv2d holding the same parameter tensors; torch.nn.MultiheadAttention becomes
QuantMultiheadAttention; and where the model traces with torch.fx, products written in its
forward as torch.matmul, torch.bmm or `@` between two activations become QuantMatmul
modules. Each quantized layer gets a LayerState with the recipe's quantizers for its module
path and position (docs/spec.md §4), so the per-layer overrides of a recipe file apply by
qualified name, exactly as in the C++ library.
"""
from __future__ import annotations

import collections
import copy
import inspect
import json
import operator
import re
import warnings
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.fx

from .. import _core
from . import _compiled
from . import _functional as fn
from ._modules import LayerSlot, QuantConv2d, QuantLinear, QuantMatmul, QuantMultiheadAttention

_LEAVES = (QuantLinear, QuantConv2d, QuantMatmul, LayerSlot)
# Evaluation runs under its own step number, as the C++ trainer's (it must not shift the
# stochastic-rounding streams of training).
_EVAL_STEP = (1 << 64) - 2
# Modules with products that have no quantized op here: left float32, and said so.
_UNSUPPORTED = (torch.nn.Conv1d, torch.nn.Conv3d, torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d,
                torch.nn.ConvTranspose3d, torch.nn.Bilinear, torch.nn.RNNBase)


class QuantState:
    """What quantize_model did to a model, and its quantization state while it trains.

    layers: module path -> LayerState, in model order. skipped: (path, reason) of products
    left float32. The model's forward advances `step` once per call in training mode
    (stochastic rounding streams and statistics intervals follow it); in evaluation mode it
    quantizes under a separate step number and records neither counts nor statistics."""

    def __init__(self, ctx, recipe, layers, skipped, traced: Optional[str]):
        self.context = ctx
        self.recipe = recipe
        self.layers: Dict[str, _core.LayerState] = layers
        self.skipped: List[Tuple[str, str]] = skipped
        self.traced = traced  # None: not traced; else what tracing did
        # fp8lab.torch.quantized: products that ran float32 inside it, name -> (calls, reason).
        self.unquantized: Dict[str, Tuple[int, str]] = collections.OrderedDict()
        self.auto_step = True
        self._next = 0
        self._saved = None
        self._watch: list = []  # quantize_model's: hooks noting which converted layers the first step runs
        self._ran_layers: set = set()
        self._watched: set = set()

    # -- step bookkeeping (forward hooks of the quantized model) -----------------------------
    # Eagerly the hooks call _event; while torch.compile traces, they put the same call in
    # the graph as an ordered effect (_compiled.state_event), so that it runs at each call of
    # the compiled model, in its place among the products.
    def _before_forward(self, module, args):
        self._hook("begin-train" if module.training else "begin-eval")

    def _after_forward(self, module, args, out):
        self._hook("end-train" if module.training else "end-eval")

    def _mark_ran(self, module, args) -> None:
        self._hook("ran", module.layer)

    def _hook(self, event: str, layer=None) -> None:
        if not torch.compiler.is_compiling() or not _compiled.AVAILABLE:
            self._event(event, layer)
        elif event != "ran":  # the check of idle layers is made in eager runs only
            _compiled.state_event(self, "end-train-compiled" if event == "end-train" else event, layer)

    @torch.compiler.disable  # called eagerly, or by fp8lab::state_event at run time: never traced
    def _event(self, event: str, layer) -> None:
        handler = _EVENTS.get(event)
        if handler is None:
            raise ValueError(f"QuantState: no event {event!r} (events: {', '.join(_EVENTS)})")
        handler(self, layer)

    def _begin_train(self, _layer) -> None:
        if self.auto_step:
            self.context.step = self._next
            self._next += 1

    def _begin_eval(self, _layer) -> None:
        """Evaluation runs under its own step and records nothing; end-eval restores both."""
        self._saved = (self.context.step, self.context.recording)
        self.context.step = _EVAL_STEP
        self.context.recording = False

    def _end_eval(self, _layer) -> None:
        if self._saved is not None:
            self.context.step, self.context.recording = self._saved
            self._saved = None

    def _end_train(self, _layer) -> None:
        if self._watch:
            self._warn_idle()

    def _end_train_compiled(self, _layer) -> None:
        self._unwatch()

    def _ran(self, layer) -> None:
        self._ran_layers.add(layer.name)

    def _unwatch(self) -> None:
        for h in self._watch:
            h.remove()
        self._watch = []

    def _watch_layers(self, modules) -> None:
        """Notes which of these converted layers the first training forward runs."""
        self._watched = {m.layer.name for m in modules}
        self._watch = [m.register_forward_pre_hook(self._mark_ran) for m in modules]

    def _warn_idle(self) -> None:
        """After the first training forward: the converted layers that did not run. A parent
        that reads a layer's weight itself (torchvision's Swin calls F.linear on its
        attention's qkv.weight) bypasses the layer, and its products run float32."""
        self._unwatch()
        idle = [p for p in self.layers if p in self._watched and p not in self._ran_layers]
        if idle:
            shown = ", ".join(idle[:6]) + (f" and {len(idle) - 6} more" if len(idle) > 6 else "")
            warnings.warn(f"fp8lab.torch.quantize_model: {len(idle)} converted layers did not run in the first "
                          f"training forward ({shown}): where a parent module reads their weights itself "
                          "(F.linear(x, self.fc.weight)), those products run float32; fp8lab.torch.quantized "
                          "quantizes them", stacklevel=3)

    @property
    def shard(self) -> int:
        """The shard of the step's batch the next passes compute (0: the whole batch). A
        data-parallel rank computing shard r of each step sets shard = r: every shard draws
        its own stochastic-rounding streams, so N ranks give what one process gives running
        the N shards in turn (docs/python.md, "Data-parallel training")."""
        return self.context.shard

    @shard.setter
    def shard(self, m: int) -> None:
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"shard must be an integer >= 0, got {m!r}")
        self.context.shard = m

    @property
    def step(self) -> int:
        """The step the next training forward pass runs as."""
        return self._next

    @step.setter
    def step(self, s: int) -> None:
        self._next = int(s)
        self.context.step = int(s)

    # -- what the layers did ------------------------------------------------------------------
    def counts(self) -> Dict[str, dict]:
        """Per layer and kind: values quantized, overflows, underflows, NaNs since the last
        reset_counts()."""
        return {p: l.counts() for p, l in self.layers.items()}

    def reset_counts(self) -> None:
        for l in self.layers.values():
            l.reset_counts()

    def products(self) -> Dict[str, dict]:
        """Per layer: products run on the float32 and bfloat16 paths."""
        return {p: l.products() for p, l in self.layers.items()}

    def stats(self) -> List[dict]:
        """The statistics records since the last call (context stats_interval > 0): per step,
        layer and kind, the exponent histogram of the tensor before quantization (and, for
        scaled kinds, the group figures and the scales' histogram), the counts and the
        largest magnitude, as the results store holds them."""
        return [{"step": r.step, "layer": r.layer, "kind": r.kind, "absmax": r.absmax,
                 "counts": {"total": r.total, "overflow": r.overflow, "underflow": r.underflow, "nan": r.nan},
                 "histogram": json.loads(r.histogram_json)} for r in self.context.take_stat_rows()]

    def quantizers(self) -> Dict[str, dict]:
        return {p: l.quant.as_dict() for p, l in self.layers.items()}

    def __repr__(self) -> str:
        lines = [f"QuantState(recipe={self.recipe!r}, {len(self.layers)} quantized layers, step {self._next})"]
        for p, l in self.layers.items():
            q = l.quant.as_dict()
            lines.append(f"  {p}: " + " ".join(f"{k}={v}" for k, v in q.items()))
        for p, why in self.skipped:
            lines.append(f"  {p}: float32 ({why})")
        for p, (n, why) in self.unquantized.items():
            lines.append(f"  {p}: float32 in {n} calls ({why})")
        return "\n".join(lines)


# The step bookkeeping's events (QuantState._event; fp8lab::state_event names them).
_EVENTS = {
    "begin-train": QuantState._begin_train,
    "begin-eval": QuantState._begin_eval,
    "end-train": QuantState._end_train,
    "end-train-compiled": QuantState._end_train_compiled,
    "end-eval": QuantState._end_eval,
    "ran": QuantState._ran,
}


def quant_state(model: torch.nn.Module) -> QuantState:
    """The QuantState of a model quantize_model returned."""
    s = getattr(model, "_fp8lab_state", None)
    if s is None:
        raise ValueError("this model was not made by fp8lab.torch.quantize_model")
    return s


def _recipe(recipe) -> _core.Recipe:
    return recipe if isinstance(recipe, _core.Recipe) else _core.Recipe(str(recipe))


def _settings(r: _core.Recipe, compute: Optional[str], accumulate: Optional[str]) -> Tuple[str, str]:
    """The run's compute and accumulation, by the precedence of `fp8lab train`
    (docs/spec.md §4.2): the arguments, else the recipe file's, else float32."""
    out = []
    for arg, from_file in ((compute, r.compute), (accumulate, r.accumulate)):
        out.append(arg if arg is not None else (from_file or "fp32"))
    return out[0], out[1]


def _plain(m: torch.nn.Module, base: type) -> bool:
    """m is a `base` (or a subclass of it that changes none of its computation)."""
    return isinstance(m, base) and all(getattr(type(m), f, None) is getattr(base, f, None)
                                       for f in ("forward", "_conv_forward"))


def _why_kept(m: torch.nn.Module) -> Optional[str]:
    """Why a Linear or Conv2d stays as it is, or None: its weight is computed (weight_norm,
    spectral_norm: a replacement would drop the parametrization), or a same padding that
    QuantConv2d cannot give (an even dilated kernel pads unevenly)."""
    if not isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
        return None
    extra = sorted(n for n, _ in m.named_parameters(recurse=False) if n not in ("weight", "bias"))
    if torch.nn.utils.parametrize.is_parametrized(m) or extra:
        what = "parametrized weight" if not extra else "weight computed from " + ", ".join(extra)
        return (f"{type(m).__name__} with a {what} (weight_norm, spectral_norm): replacing it would drop the "
                "parametrization; fp8lab.torch.quantized quantizes its products as they run")
    if isinstance(m, torch.nn.Conv2d) and m.padding == "same" and any(
            d * (k - 1) % 2 for d, k in zip(m.dilation, m.kernel_size)):
        return "Conv2d padding='same' with an even dilated kernel pads unevenly, which QuantConv2d cannot"
    return None


def _convert_children(module: torch.nn.Module, prefix: str, attention: bool, skipped: list,
                      seen: Optional[dict] = None) -> None:
    """Replaces plain layers by quantized ones in place, depth first. A module that appears
    in several places (one Linear used twice in a Sequential) is converted once and the
    conversion put in every place, so that every use is quantized and the weights stay
    shared; `seen` maps the id of each module met so far to (the module, what replaced it),
    the module kept so that its id cannot be reused while the conversion runs."""
    seen = {} if seen is None else seen
    # _modules, not named_children(): named_children() yields a module used twice only once.
    for name, child in list(module._modules.items()):
        if child is None:
            continue
        path = f"{prefix}.{name}" if prefix else name
        if id(child) in seen:
            if seen[id(child)][1] is not child:
                setattr(module, name, seen[id(child)][1])
            continue
        if isinstance(child, _LEAVES):
            seen[id(child)] = (child, child)
            continue
        kept = _why_kept(child)
        if kept is not None:
            skipped.append((path, kept))
        elif _plain(child, torch.nn.Linear):
            setattr(module, name, QuantLinear.adopt(child))
        elif _plain(child, torch.nn.Conv2d):
            setattr(module, name, QuantConv2d.adopt(child))
        elif isinstance(child, torch.nn.MultiheadAttention):
            if attention:
                setattr(module, name, QuantMultiheadAttention(child))
            else:
                skipped.append((path, "MultiheadAttention left as it is (attention=False)"))
        elif isinstance(child, (torch.nn.Linear, torch.nn.Conv2d)):
            skipped.append((path, f"{type(child).__name__} subclasses {type(child).__mro__[1].__name__} with "
                                  "its own code; replace it with a QuantLinear/QuantConv2d yourself"))
        elif isinstance(child, _UNSUPPORTED):
            skipped.append((path, f"{type(child).__name__} has no quantized op"))
        else:
            if isinstance(child, torch.nn.TransformerEncoderLayer):
                # libtorch's fused inference path of encoder layers (eval mode, no grad) reads
                # the weights directly and would bypass the quantized layers: turn it off.
                child.activation_relu_or_gelu = 0
            _convert_children(child, path, attention, skipped, seen)
        seen[id(child)] = (child, module._modules[name])


def _convert_root(model: torch.nn.Module, attention: bool, skipped: list) -> torch.nn.Module:
    """A model that is itself one layer (a bare Linear, Conv2d or MultiheadAttention): its
    quantized replacement (the same parameter tensors), or the model, with the reason."""
    kept = _why_kept(model)
    if kept is not None:
        skipped.append(("", kept))
    elif _plain(model, torch.nn.Linear):
        return QuantLinear.adopt(model)
    elif _plain(model, torch.nn.Conv2d):
        return QuantConv2d.adopt(model)
    elif isinstance(model, torch.nn.MultiheadAttention) and attention:
        return QuantMultiheadAttention(model)
    elif isinstance(model, _UNSUPPORTED):
        skipped.append(("", f"{type(model).__name__} has no quantized op"))
    return model


# The layer name of a model that is itself one quantized layer (its module path is empty),
# as the dispatch path names that product.
_ROOT_NAMES = {QuantLinear: "linear", QuantConv2d: "conv"}


_PRODUCT_CALLS = re.compile(r"\bmatmul\b|\bbmm\b|\beinsum\b|@")


def _may_multiply_activations(model: torch.nn.Module) -> bool:
    """Whether a forward written outside torch (the model's own classes) may call torch.matmul,
    bmm, einsum or `@`: from its source, or True where the source cannot be read."""
    for m in model.modules():
        if isinstance(m, (*_LEAVES, QuantMultiheadAttention)):
            continue
        for cls in type(m).__mro__:  # the forwards it runs, inherited ones included
            if "forward" not in cls.__dict__ or cls.__module__.startswith("torch."):
                continue
            try:
                source = inspect.getsource(cls.__dict__["forward"])
            except (OSError, TypeError):
                return True
            if _PRODUCT_CALLS.search(source):
                return True
    return False


class _Tracer(torch.fx.Tracer):
    """Traces with fp8lab's modules as leaves, noting the module path each node comes from."""

    def __init__(self):
        super().__init__()
        self.paths = [""]

    def is_leaf_module(self, m, qualname):
        return isinstance(m, (*_LEAVES, QuantMultiheadAttention)) or super().is_leaf_module(m, qualname)

    def call_module(self, m, forward, args, kwargs):
        self.paths.append(self.path_of_module(m))
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self.paths.pop()

    def create_node(self, *args, **kwargs):
        node = super().create_node(*args, **kwargs)
        node.meta["fp8lab_path"] = self.paths[-1]
        return node


def _attach(model: torch.nn.Module, state: QuantState) -> torch.nn.Module:
    """Makes `state` the model's QuantState, stepping with its forward passes."""
    model._fp8lab_state = state
    model.register_forward_pre_hook(state._before_forward)
    model.register_forward_hook(state._after_forward)
    return model


def _restore_traced(reduce_fn, args, state):
    return _attach(reduce_fn(*args), state)


class QuantGraphModule(torch.fx.GraphModule):
    """The torch.fx.GraphModule quantize_model returns for a model whose matmul products it
    traced: GraphModule's own copy and pickling keep only the graph's modules, these also
    keep the QuantState."""

    def __deepcopy__(self, memo):
        fake = torch.nn.Module()
        fake.__dict__ = copy.deepcopy(self.__dict__, memo)
        new = QuantGraphModule(fake, fake.__dict__["_graph"], type(self).__mro__[1].__name__)
        state = fake.__dict__.get("_fp8lab_state")
        return _attach(new, state) if state is not None else new

    def __reduce__(self):
        fn, args = super().__reduce__()
        return (_restore_traced, (fn, args, self.__dict__.get("_fp8lab_state")))


_MATMUL_FUNCTIONS = (torch.matmul, torch.bmm, operator.matmul)
_MATMUL_METHODS = ("matmul", "bmm", "__matmul__")


def _is_matmul(node) -> bool:
    return ((node.op == "call_function" and node.target in _MATMUL_FUNCTIONS)
            or (node.op == "call_method" and node.target in _MATMUL_METHODS))


def _from_parameter(node) -> bool:
    """Whether a value comes straight from a parameter or buffer (through views)."""
    while node.op == "call_method" and node.target in ("t", "transpose", "permute", "view", "reshape", "contiguous"):
        node = node.args[0]
    return node.op == "get_attr"


def _trace_matmuls(model: torch.nn.Module, skipped: list):
    """A GraphModule whose activation products are QuantMatmul modules, or (model, note)."""
    tracer = _Tracer()
    graph = tracer.trace(model)
    gm = QuantGraphModule(tracer.root, graph, model.__class__.__name__)
    used = collections.Counter()
    replaced = 0
    for node in list(gm.graph.nodes):
        if not _is_matmul(node):
            continue
        owner = node.meta.get("fp8lab_path", "")
        a, b = node.args[0], node.args[1]
        if _from_parameter(a) or _from_parameter(b):
            skipped.append((f"{owner or '<model>'}:{node.name}", "a product with a parameter is left float32: "
                            "write it as a torch.nn.Linear to quantize it"))
            continue
        base = "matmul"
        n = used[owner]
        used[owner] += 1
        target = f"{owner}.{base}" if owner else base
        if n:
            target += f"_{n}"
        gm.add_submodule(target, QuantMatmul())
        with gm.graph.inserting_after(node):
            new = gm.graph.call_module(target, (a, b))
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        replaced += 1
    if not replaced:
        return model, "traced: no product between activations in the forward"
    gm.graph.lint()
    gm.recompile()
    return gm, f"traced: {replaced} torch.matmul/bmm/@ products became QuantMatmul modules"


def _in_run_order(model: torch.nn.Module, sites: list) -> list:
    """The layers in the order a traced model's graph runs them (the QuantMatmul modules
    tracing added come last in the module tree, not where they run), each at the place of
    its closest module the graph calls; module-tree order for a model not traced."""
    if not isinstance(model, torch.fx.GraphModule):
        return sites
    calls = {}
    for node in model.graph.nodes:
        if node.op == "call_module":
            calls.setdefault(node.target, len(calls))

    def key(item):
        i, (path, _) = item
        parts = path.split(".")
        for n in range(len(parts), 0, -1):
            at = calls.get(".".join(parts[:n]))
            if at is not None:
                return (at, i)
        return (len(calls), i)
    return [site for _, site in sorted(enumerate(sites), key=key)]


def quantize_model(model: torch.nn.Module, recipe: Union[str, _core.Recipe] = "fp32", *, seed: int = 0,
                   compute: Optional[str] = None, accumulate: Optional[str] = None, stats_interval: int = 0,
                   save_codes: bool = True, attention: bool = True, trace: str = "auto") -> torch.nn.Module:
    """Quantizes `model` with `recipe` (a preset, a line 'a=1.4.3,w=1.4.3,gx=1.5.2:24,gw=fp32'
    or a recipe .toml file with per-layer overrides) and returns it.

    What converts: every torch.nn.Linear and Conv2d (and subclasses that change none of
    their computation) becomes a QuantLinear / QuantConv2d, nn.MultiheadAttention a
    QuantMultiheadAttention (attention=True), anywhere in the tree, the model itself
    included. What stays float32 is listed with its reason in quant_state(model).skipped
    (Conv1d/3d, transposed convolutions, RNNs, layers with a computed weight...; the
    context manager fp8lab.torch.quantized quantizes most of them). The recipe's first
    layer keeps its input in float32 unless the recipe says first=false; `last` and
    overrides select layers by position and qualified name (docs/spec.md §4).

    The model is changed in place (its parameters stay the same tensors, so an optimizer
    built before keeps working; a model that is itself one layer is returned as its
    quantized replacement), except that a model whose forward calls torch.matmul,
    torch.bmm or `@` on two activations is returned as a torch.fx.GraphModule with those
    products quantized (trace='auto', when the model traces; trace='off' skips tracing;
    trace='require' makes a model that does not trace an error). Where the model does not
    trace, such products stay float32, and the returned model's QuantState says so.

    seed: the run seed of stochastic rounding. compute / accumulate: the products' path and
    accumulation (docs/spec.md §7), else the recipe file's, else fp32. stats_interval:
    record exponent histograms every N steps. fp8lab.torch.quant_state(model) gives the
    layers, counts and statistics.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"quantize_model takes a torch.nn.Module, got {type(model).__name__}")
    if trace not in ("auto", "off", "require"):
        raise ValueError(f"trace must be 'auto', 'off' or 'require' (got {trace!r})")
    if getattr(model, "_fp8lab_state", None) is not None:
        raise ValueError("this model is quantized already; quantize the original model once")
    r = _recipe(recipe)
    comp, acc = _settings(r, compute, accumulate)
    ctx = fn.context(seed=seed, compute=comp, accumulate=acc, stats_interval=stats_interval, save_codes=save_codes)
    skipped: list = []
    model = _convert_root(model, attention, skipped)
    _convert_children(model, "", attention, skipped)
    traced = None
    if trace != "off":
        try:
            model, traced = _trace_matmuls(model, skipped)
        except Exception as e:  # torch.fx raises many kinds on models it cannot trace
            if trace == "require":
                raise ValueError(f"the model does not trace with torch.fx: {e}") from e
            traced = (f"not traced ({type(e).__name__}: {e}); torch.matmul/bmm/@ products in its forward "
                      "stay float32: use fp8lab.torch.QuantMatmul or fp8lab.torch.matmul there")
            if _may_multiply_activations(model):
                warnings.warn(f"fp8lab.torch.quantize_model: the model is {traced}", stacklevel=2)
    sites = _in_run_order(model, [(p or _ROOT_NAMES.get(type(m), p), m) for p, m in model.named_modules()
                                  if isinstance(m, _LEAVES)])
    paths = [p for p, _ in sites]
    r.check_overrides(paths)
    layers = collections.OrderedDict()
    for i, (p, m) in enumerate(sites):
        m.layer = _core.LayerState(p, r.resolve(p, i, len(sites)), ctx, i)
        layers[p] = m.layer
    state = QuantState(ctx, r.name or r.to_line(), layers, skipped, traced)
    state._watch_layers([m for _, m in sites if isinstance(m, (QuantLinear, QuantConv2d))])
    return _attach(model, state)
