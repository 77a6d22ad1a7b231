"""quantized: every product a program runs quantized, whoever wrote it (docs/python.md).

    with fp8lab.torch.quantized(model, "resnet32-mixed"):
        loss = loss_fn(model(x), y)
    loss.backward()

A torch.overrides.TorchFunctionMode sees each torch function the program calls inside the
context. The products among them (F.linear, matmul, @, mm, bmm, mv, dot, outer, inner,
tensordot, multi_dot, addmm, baddbmm, addbmm, addmv, addr and their in-place forms, einsum,
bilinear, conv1d/2d/3d, transposed convolutions, scaled_dot_product_attention,
multi-head attention) run through the C++ library's quantized autograd functions, so that
their backward products are quantized as the recipe says; every other product (a product
of float64 tensors, an einsum diagonal, LSTM's fused kernel...) runs as torch runs it and is counted,
with its reason, in QuantState.unquantized, and named in a warning after the first
training forward.

Layers are named as quantize_model names them, so that a recipe's overrides, `first` and
`last` mean the same on both paths and the two give the same bits: a product with a
parameter takes the name of the module that holds it (a Linear at "blocks.0.fc" is layer
"blocks.0.fc"; F.linear(x, self.w) in module "mlp" is layer "mlp.w"), a product of two
activations "<module>.matmul" (then "_1", "_2" within one call of the module), attention's
two products "<module>.scores" and "<module>.context". Layers are numbered in the order
they first run; where the recipe needs their count (keep_last, an override of `last`), the
first training forward runs twice, first without gradients, quantization or side effects
(random numbers and buffers restored) to find the products.
"""
from __future__ import annotations

import collections
import math
import string
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
import torch.utils._pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .. import _core
from .._errors import UsageError
from . import _functional as fn
from ._convert import QuantState, _attach, _recipe, _settings
from ._modules import LayerSlot, QuantLinear, QuantMatmul, QuantMultiheadAttention

# A count no layer index reaches: resolve() where the recipe does not depend on the count.
_NO_COUNT = (1 << 31) - 1


def _root(t: torch.Tensor) -> torch.Tensor:
    """The tensor a view was taken of (itself when it is none)."""
    while getattr(t, "_base", None) is not None:
        t = t._base
    return t


def _layer_suffix(param_name: str) -> str:
    """A parameter's name as a layer name: "weight" names the module itself, "in_proj_weight"
    its "in_proj", any other its own name."""
    for end in ("weight", "_weight"):
        if param_name.endswith(end) and param_name != end[1:]:
            return param_name[: -len(end)].rstrip(".")
    return param_name


def _join(owner: str, leaf: str) -> str:
    return f"{owner}.{leaf}" if owner and leaf else owner or leaf


class _Names:
    """Module paths, parameter names and the call-by-call numbering of activation products."""

    def __init__(self, model: torch.nn.Module):
        self.modules = {id(m): p for p, m in model.named_modules()}
        self.params = {id(t): n for n, t in model.named_parameters()}
        self.stack: List[torch.nn.Module] = []
        self.used: Dict[int, collections.Counter] = {}

    def owner(self) -> str:
        return self.modules.get(id(self.stack[-1]), "") if self.stack else ""

    def enter(self, module) -> None:
        self.stack.append(module)
        self.used[id(module)] = collections.Counter()  # each call of a module numbers afresh

    def leave(self, module) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()

    def new_step(self) -> None:
        self.used[0] = collections.Counter()

    def of_parameter(self, t: torch.Tensor) -> Optional[str]:
        """The layer name of a product with `t` (a parameter, or a view of one), or None."""
        root = _root(t)
        if not isinstance(root, torch.nn.Parameter):
            return None
        if self.stack:  # the module running holds it itself: its path (tied weights included)
            m = self.stack[-1]
            for k, p in m._parameters.items():
                if p is root:
                    return _join(self.modules.get(id(m), ""), _layer_suffix(k))
        name = self.params.get(id(root))
        if name is None:
            return None
        owner, _, leaf = name.rpartition(".")
        return _join(owner, _layer_suffix(leaf))

    def of_weight(self, t: torch.Tensor) -> Optional[str]:
        """of_parameter, or the running module's path where `t` is its computed `weight` (a
        parametrized module: weight_norm, spectral_norm)."""
        name = self.of_parameter(t)
        if name is None and self.stack:
            m = self.stack[-1]
            if torch.nn.utils.parametrize.is_parametrized(m, "weight"):
                # Computed afresh at each access: known by the shape of its originals (weight_norm's v).
                own = any(o.shape == t.shape for o in m.parametrizations["weight"].parameters())
            else:
                own = m.__dict__.get("weight") is t  # torch.nn.utils.weight_norm's, set by its pre-forward hook
            if own:
                return self.modules.get(id(m), "") or None
        return name

    def in_parametrization(self) -> bool:
        """Whether a parametrization (weight_norm, spectral_norm) is computing a weight."""
        return any(isinstance(m, torch.nn.utils.parametrize.ParametrizationList) for m in self.stack)

    def of_activations(self, base: str) -> str:
        """"<module>.<base>", then "_1", "_2"... within one call of the module."""
        key = id(self.stack[-1]) if self.stack else 0
        used = self.used.setdefault(key, collections.Counter())
        n = used[base]
        used[base] += 1
        return _join(self.owner(), base + (f"_{n}" if n else ""))


def _bind(args, kwargs, names: Sequence[str], defaults: dict) -> dict:
    """A call's arguments by name (positional first, then keywords, then defaults)."""
    out = dict(defaults)
    out.update(zip(names, args))
    out.update(kwargs)
    return out


class _Mode(TorchFunctionMode):
    """The torch function mode of one QuantizedProgram: products to their handlers."""

    def __init__(self, program: "QuantizedProgram"):
        super().__init__()
        self.program = program

    def __torch_function__(self, func, types, args=(), kwargs=None):
        handler = _HANDLERS.get(func)
        if handler is None:
            return func(*args, **(kwargs or {}))
        p = self.program
        p.inside += 1  # what runs below is accounted for: the audit leaves it alone
        try:
            if p.names.in_parametrization():
                name = p.names.of_activations(getattr(func, "__name__", "product"))
                return _fallback(p, func, args, kwargs or {}, name, _IN_PARAMETRIZATION)
            try:
                return handler(p, func, args, kwargs or {})
            except (ValueError, TypeError):
                raise  # fp8lab's own refusals name the layer
            except Exception as e:
                refusal = _torch_refusal(func, args, kwargs or {})
                if refusal is None:
                    raise
                raise ValueError(f"fp8lab.torch.quantized: {getattr(func, '__name__', 'a product')} in "
                                 f"{p.names.owner() or 'the model'}: torch refuses these operands: {refusal}") from e
        finally:
            p.inside -= 1


def _torch_refusal(func, args, kwargs) -> Optional[str]:
    """torch's own error for a call (found on meta tensors: shapes and dtypes only, no data
    touched), or None where torch accepts it or cannot tell without the data."""
    def meta(t):
        return t.detach().to("meta") if isinstance(t, torch.Tensor) and t.layout == torch.strided else t
    try:
        with torch.no_grad():
            func(*torch.utils._pytree.tree_map(meta, list(args)), **torch.utils._pytree.tree_map(meta, dict(kwargs)))
    except NotImplementedError:
        return None
    except Exception as e:  # noqa: BLE001 - torch's refusal, whatever its class
        return str(e).split("\n")[0]
    return None


_IN_PARAMETRIZATION = ("part of a parametrized weight's computation (spectral_norm's power iteration): the layer's "
                       "product quantizes the weight it computes")


_aten = torch.ops.aten
# The products of ATen, as every torch function that multiplies ends up calling one.
_ATEN_PRODUCTS = {_aten.mm, _aten.bmm, _aten.addmm, _aten.baddbmm, _aten.addbmm, _aten.convolution, _aten.mv,
                  _aten.addmv, _aten.dot, _aten.vdot, _aten._grouped_mm, _aten._scaled_mm,
                  _aten._scaled_dot_product_flash_attention_for_cpu, _aten._scaled_dot_product_efficient_attention,
                  _aten._scaled_dot_product_flash_attention, _aten.cudnn_convolution, _aten._convolution,
                  _aten.mkldnn_convolution, _aten.addmm_, _aten.baddbmm_, _aten.addbmm_, _aten.addmv_, _aten.addr,
                  _aten.addr_, _aten._int_mm, _aten.mkldnn_rnn_layer, _aten._thnn_fused_lstm_cell,
                  _aten._thnn_fused_gru_cell, _aten._cudnn_rnn, _aten.miopen_rnn, _aten.mkldnn_linear}


class _Audit(TorchDispatchMode):
    """Below the torch functions, during the first forward passes: an ATen product that no
    handler ran (a function fp8lab does not take apart, a custom op) is counted unquantized."""

    def __init__(self, program: "QuantizedProgram"):
        super().__init__()
        self.program = program

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        p = self.program
        if not p.inside and func.overloadpacket in _ATEN_PRODUCTS:
            p.inside += 1  # one product may call another (addmm as mm): count the outer one
            try:
                p.unquantized(_join(p.names.owner(), f"aten.{func.overloadpacket.__name__}"),
                              "an ATen product below a function fp8lab does not take apart")
                return func(*args, **(kwargs or {}))
            finally:
                p.inside -= 1
        return func(*args, **(kwargs or {}))


class QuantizedProgram:
    """What fp8lab.torch.quantized returns: a context manager, entered as often as wanted
    (each training step, say), that quantizes the products run inside it; `state` is the
    model's QuantState (fp8lab.torch.quant_state(model))."""

    def __init__(self, model: torch.nn.Module, recipe, *, seed: int = 0, compute: Optional[str] = None,
                 accumulate: Optional[str] = None, stats_interval: int = 0, save_codes: bool = True):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"quantized takes a torch.nn.Module, got {type(model).__name__}")
        if getattr(model, "_fp8lab_state", None) is not None:
            raise ValueError("this model is quantized already (quantize_model or another quantized()); "
                             "quantize the original model once")
        self.model = model
        self.recipe = _recipe(recipe)
        comp, acc = _settings(self.recipe, compute, accumulate)
        ctx = fn.context(seed=seed, compute=comp, accumulate=acc, stats_interval=stats_interval,
                         save_codes=save_codes)
        self.state = QuantState(ctx, self.recipe.name or self._recipe_text(), collections.OrderedDict(), [],
                                "dispatch: every product run inside fp8lab.torch.quantized")
        self.names = _Names(model)
        self.order: List[str] = []
        self.count: Optional[int] = None if self.recipe.depends_on_count else _NO_COUNT
        self.discovering = False
        self.warned = False
        self.attention: Dict[int, QuantMultiheadAttention] = {}
        self._mode: Optional[_Mode] = None
        self._audit: Optional[_Audit] = None
        self._hooks: list = []
        self._depth = 0
        self.inside = 0
        model._fp8lab_state = self.state
        model._fp8lab_program = self

    def _recipe_text(self) -> str:
        try:
            return self.recipe.to_line()
        except ValueError:
            return "<recipe with overrides>"

    # -- entering and leaving -----------------------------------------------------------------
    def __enter__(self) -> "QuantizedProgram":
        if self._mode is not None:
            raise UsageError("fp8lab.torch.quantized: this context is entered already")
        for m in self.model.modules():
            self._hooks.append(m.register_forward_pre_hook(self._module_pre))
            self._hooks.append(m.register_forward_hook(self._module_post))
        self._hooks.append(self.model.register_forward_pre_hook(self._model_pre, with_kwargs=True))
        self._hooks.append(self.model.register_forward_hook(self._model_post))
        self._mode = _Mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        mode, self._mode = self._mode, None
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self.names.stack.clear()
        self._depth = self.inside = 0
        self._end_audit()  # a forward that raised left it on
        mode.__exit__(*exc)

    def _end_audit(self) -> None:
        audit, self._audit = self._audit, None
        if audit is not None:
            audit.__exit__(None, None, None)

    # -- hooks --------------------------------------------------------------------------------
    @torch.compiler.disable  # bookkeeping: runs eagerly under torch.compile
    def _module_pre(self, module, args):
        self.names.enter(module)

    @torch.compiler.disable  # bookkeeping: runs eagerly under torch.compile
    def _module_post(self, module, args, out):
        self.names.leave(module)

    @torch.compiler.disable  # bookkeeping: runs eagerly under torch.compile
    def _model_pre(self, module, args, kwargs):
        self._depth += 1
        if self._depth > 1:
            return None
        self.names.new_step()
        if self.count is None and not self.discovering:
            self._discover(args, kwargs)
        if not self.discovering:
            self.state._before_forward(module, args)
            if not self.warned:
                self._audit = _Audit(self)
                self._audit.__enter__()
        return None

    @torch.compiler.disable  # bookkeeping: runs eagerly under torch.compile
    def _model_post(self, module, args, out):
        self._depth -= 1
        if self._depth > 0 or self.discovering:
            return None
        self.state._after_forward(module, args, out)
        self._end_audit()
        if module.training and not self.warned:
            self.warned = True
            self._warn_unquantized()
        return None

    def _discover(self, args, kwargs) -> None:
        """Runs the forward once without gradients, quantization or lasting side effects to
        find the products in the order they run, and so their count."""
        buffers = [(b, b.detach().clone()) for b in self.model.buffers()]
        self.discovering = True
        depth, self._depth = self._depth, 0
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                self.model(*args, **kwargs)
        finally:
            self.discovering = False
            self._depth = depth
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
            self.names.new_step()
            self.names.used[id(self.model)] = collections.Counter()  # the outer call numbers afresh
        self.count = len(self.order)

    def _warn_unquantized(self) -> None:
        u = self.state.unquantized
        if not u:
            return
        listed = "; ".join(f"{name} ({n}x: {why})" for name, (n, why) in list(u.items())[:8])
        more = f"; and {len(u) - 8} more" if len(u) > 8 else ""
        warnings.warn(f"fp8lab.torch.quantized: {len(u)} products ran in float32: {listed}{more} "
                      "(quant_state(model).unquantized lists them)", stacklevel=3)

    # -- layers -------------------------------------------------------------------------------
    def layer(self, name: str):
        """The LayerState of layer `name` (made at its first use), or None while discovering."""
        st = self.state.layers.get(name)
        if st is not None:
            return st
        if name not in self.order:
            self.order.append(name)
        if self.discovering:
            return None
        index = self.order.index(name)
        # A product run before the model's first forward (outside it) cannot be the last.
        count = self.count if self.count is not None else _NO_COUNT
        st = _core.LayerState(name, self.recipe.resolve(name, index, count), self.state.context, index)
        self.state.layers[name] = st
        return st

    def unquantized(self, name: str, why: str) -> None:
        if self.discovering:
            return
        n, _ = self.state.unquantized.get(name, (0, why))
        self.state.unquantized[name] = (n + 1, why)


# -- the products ---------------------------------------------------------------------------

_QUANTIZABLE = (torch.float32, torch.bfloat16, torch.float16)  # exact in float32: quantized from there


def _quantizable(*ts) -> bool:
    """Every operand is a tensor whose values float32 holds exactly (float32, bfloat16, float16)."""
    return all(t is None or (isinstance(t, torch.Tensor) and t.dtype in _QUANTIZABLE) for t in ts)


def _refusal(out, *ts) -> Optional[str]:
    """Why a product runs float32 (out= given; operands float32 cannot hold), or None."""
    if out is not None:
        return "out= given"
    return None if _quantizable(*ts) else _dtype_reason(*ts)


def _fallback(p: QuantizedProgram, func, args, kwargs, name: str, why: str):
    p.unquantized(name, why)
    return func(*args, **kwargs)


def _dtype_reason(*ts) -> str:
    kinds = sorted({str(t.dtype).replace("torch.", "") for t in ts if isinstance(t, torch.Tensor)} -
                   {"float32", "bfloat16", "float16"})
    return (f"{', '.join(kinds) or 'non-tensor'} operands (fp8lab quantizes products of float32, bfloat16 and "
            "float16 values)")


def _product(p: QuantizedProgram, a: torch.Tensor, b: torch.Tensor, base: str = "matmul") -> Optional[torch.Tensor]:
    """torch.matmul(a, b) quantized: as a linear layer where one operand is a 2-d parameter
    (the weight quantizer on it, grad_w for its gradient), else as a product of activations."""
    nb = p.names.of_parameter(b) if b.dim() == 2 else None
    na = p.names.of_parameter(a) if a.dim() == 2 else None
    if nb is not None:
        layer = p.layer(nb)
        return None if layer is None else fn.linear(a, b.t(), None, layer)
    if na is not None:
        layer = p.layer(na)
        return None if layer is None else fn.linear(b.transpose(-1, -2), a, None, layer).transpose(-1, -2)
    layer = p.layer(p.names.of_activations(base))
    return None if layer is None else fn.matmul(a, b, layer)


def _any_product(p: QuantizedProgram, a: torch.Tensor, b: torch.Tensor) -> Optional[torch.Tensor]:
    """torch.matmul(a, b) quantized, vectors included: a 1-d operand is a 1xK row (left) or a
    Kx1 column (right) and the dimension it adds is dropped again, as matmul defines it."""
    if a.dim() >= 2 and b.dim() >= 2:
        return _product(p, a, b)
    prod = _product(p, a.unsqueeze(0) if a.dim() == 1 else a, b.unsqueeze(-1) if b.dim() == 1 else b)
    if prod is None:
        return None
    if b.dim() == 1:
        prod = prod.squeeze(-1)
    if a.dim() == 1:
        prod = prod.squeeze(-1 if b.dim() == 1 else -2)
    return prod


_MATMULS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__)


def _matmul(p, func, args, kwargs):
    a, b = args[0], args[1] if len(args) > 1 else kwargs.get("other", kwargs.get("mat2"))
    if func is torch.Tensor.__rmatmul__:
        a, b = b, a
    why = _refusal(kwargs.get("out"), a, b)
    if why:
        return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), why)
    vectors = func in _MATMULS and min(a.dim(), b.dim()) == 1
    if not vectors and (a.dim() < 2 or b.dim() < 2):
        return func(*args, **kwargs)  # torch's own error (mm and bmm take matrices; matmul no scalars)
    prod = _any_product(p, a, b)
    return func(*args, **kwargs) if prod is None else prod


def _vector_op(shape_ok, operands: Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]):
    """A handler for mv, dot and outer: the two operands as matmul's (shape_ok: the dims torch
    takes; otherwise torch's own error)."""
    def run(p, func, args, kwargs):
        a = args[0]
        b = args[1] if len(args) > 1 else next((v for k, v in kwargs.items() if k != "out"), None)
        if kwargs.get("out") is not None:
            return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), "out= given")
        if not isinstance(b, torch.Tensor) or not shape_ok(a, b):
            return func(*args, **kwargs)
        if not _quantizable(a, b):
            return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), _dtype_reason(a, b))
        prod = _any_product(p, *operands(a, b))
        return func(*args, **kwargs) if prod is None else prod
    return run


_mv = _vector_op(lambda a, b: a.dim() == 2 and b.dim() == 1, lambda a, b: (a, b))
_dot = _vector_op(lambda a, b: a.dim() == 1 and b.dim() == 1, lambda a, b: (a, b))
_outer = _vector_op(lambda a, b: a.dim() == 1 and b.dim() == 1, lambda a, b: (a.unsqueeze(1), b.unsqueeze(0)))


def _tensordot_dims(a: torch.Tensor, b: torch.Tensor, dims) -> Tuple[List[int], List[int]]:
    """tensordot's contracted dimensions of a and of b."""
    if isinstance(dims, torch.Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        return list(range(a.dim() - dims, a.dim())), list(range(dims))
    da, db = dims
    da, db = ([da] if isinstance(da, int) else list(da)), ([db] if isinstance(db, int) else list(db))
    return [d % a.dim() for d in da], [d % b.dim() for d in db]


def _contract_dims(p, a, b, da: List[int], db: List[int]) -> Optional[torch.Tensor]:
    """The product summing a's dimensions da against b's db (tensordot): a as [free, contracted],
    b as [contracted, free], one 2-d product, reshaped to a's free then b's free dimensions."""
    fa = [d for d in range(a.dim()) if d not in da]
    fb = [d for d in range(b.dim()) if d not in db]
    k = math.prod(a.shape[d] for d in da)
    a2 = a.permute(fa + da).reshape(math.prod(a.shape[d] for d in fa), k)
    b2 = b.permute(db + fb).reshape(k, math.prod(b.shape[d] for d in fb))
    prod = _product(p, a2, b2)
    return None if prod is None else prod.reshape([a.shape[d] for d in fa] + [b.shape[d] for d in fb])


def _tensordot(p, func, args, kwargs):
    c = _bind(args, kwargs, ("a", "b", "dims"), {"dims": 2, "out": None})
    a, b = c["a"], c["b"]
    why = _refusal(c["out"], a, b)
    if why:
        return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), why)
    try:
        da, db = _tensordot_dims(a, b, c["dims"])
    except (TypeError, ValueError, ZeroDivisionError):
        return func(*args, **kwargs)  # torch's own error for the dims
    if len(da) != len(db) or any(a.shape[i] != b.shape[j] for i, j in zip(da, db)) or not (da or db):
        return func(*args, **kwargs)  # torch's error, or an outer product without a sum (no product)
    prod = _contract_dims(p, a, b, da, db)
    return func(*args, **kwargs) if prod is None else prod


def _inner(p, func, args, kwargs):
    a, b = args[0], args[1] if len(args) > 1 else kwargs.get("other")
    if kwargs.get("out") is not None:
        return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), "out= given")
    if not isinstance(b, torch.Tensor) or min(a.dim(), b.dim()) == 0 or a.shape[-1] != b.shape[-1]:
        return func(*args, **kwargs)  # a scalar's inner product is a multiplication; or torch's own error
    if not _quantizable(a, b):
        return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), _dtype_reason(a, b))
    prod = _contract_dims(p, a, b, [a.dim() - 1], [b.dim() - 1])
    return func(*args, **kwargs) if prod is None else prod


def _multi_dot(p, func, args, kwargs):
    """linalg.multi_dot and chain_matmul: the products left to right (torch may choose another
    order, which sums in another order)."""
    ts = list(args[0]) if func is torch.linalg.multi_dot else list(args)
    if kwargs.get("out") is not None:
        return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), "out= given")
    if len(ts) < 2 or not all(isinstance(t, torch.Tensor) for t in ts):
        return func(*args, **kwargs)
    if not _quantizable(*ts):
        return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), _dtype_reason(*ts))
    cur = ts[0]
    for t in ts[1:]:
        cur = _any_product(p, cur, t)
        if cur is None:
            return func(*args, **kwargs)
    return cur


_ADDMM, _BADDBMM = ("mat1", "mat2"), ("batch1", "batch2")


def _scaled_sum(inp, prod, beta, alpha):
    """beta * inp + alpha * prod, as torch's addmm and baddbmm define it (beta 0 ignores inp)."""
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod
    return (inp if beta == 1 else inp * beta) + prod


def _bind_scaled(args, kwargs, operands: Tuple[str, str]) -> dict:
    """addmm's and baddbmm's arguments: input, the two operands, beta, alpha, out."""
    return _bind(args, kwargs, ("input",) + operands, {"beta": 1, "alpha": 1, "out": None})


def _scaled_refusal(c: dict, operands: Tuple[str, str]) -> Optional[str]:
    """Why a scaled product (addmm, baddbmm) runs float32, or None."""
    return _refusal(c["out"], c["input"], c[operands[0]], c[operands[1]])


def _addmm(p, func, args, kwargs):
    c = _bind_scaled(args, kwargs, _ADDMM)
    inp, m1, m2 = c["input"], c["mat1"], c["mat2"]
    why = _scaled_refusal(c, _ADDMM)
    if why:
        return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), why)
    if m1.dim() != 2 or m2.dim() != 2:
        return func(*args, **kwargs)  # torch's own error for the shapes
    name = p.names.of_parameter(m2)
    if name is not None and c["beta"] == 1 and c["alpha"] == 1 and inp.dim() == 1:
        layer = p.layer(name)  # x @ W + b: a linear layer with its bias (GPT-2's Conv1D)
        return func(*args, **kwargs) if layer is None else fn.linear(m1, m2.t(), inp, layer)
    prod = _product(p, m1, m2)
    return func(*args, **kwargs) if prod is None else _scaled_sum(inp, prod, c["beta"], c["alpha"])


def _baddbmm(p, func, args, kwargs):
    c = _bind_scaled(args, kwargs, _BADDBMM)
    why = _scaled_refusal(c, _BADDBMM)
    if why:
        return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), why)
    prod = _product(p, c["batch1"], c["batch2"])
    return func(*args, **kwargs) if prod is None else _scaled_sum(c["input"], prod, c["beta"], c["alpha"])


def _scaled_op(operands: Tuple[str, str], product: Callable):
    """A handler of beta * input + alpha * product(a, b): addmv, addbmm, addr."""
    def run(p, func, args, kwargs):
        c = _bind_scaled(args, kwargs, operands)
        why = _scaled_refusal(c, operands)
        if why:
            return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"), why)
        x, y = c[operands[0]], c[operands[1]]
        try:
            prod = product(p, x, y)
        except (RuntimeError, IndexError):
            return func(*args, **kwargs)  # torch's own error for the shapes
        return func(*args, **kwargs) if prod is None else _scaled_sum(c["input"], prod, c["beta"], c["alpha"])
    return run


def _summed_bmm(p, b1, b2):
    if b1.dim() != 3 or b2.dim() != 3:
        raise RuntimeError("addbmm takes 3-d batches")
    prod = _product(p, b1, b2)
    return None if prod is None else prod.sum(0)


def _mv_product(p, m, v):
    if m.dim() != 2 or v.dim() != 1:
        raise RuntimeError("addmv takes a matrix and a vector")
    return _any_product(p, m, v)


def _outer_product(p, u, v):
    if u.dim() != 1 or v.dim() != 1:
        raise RuntimeError("addr takes two vectors")
    return _product(p, u.unsqueeze(1), v.unsqueeze(0))


_addmv = _scaled_op(("mat", "vec"), _mv_product)
_addbmm = _scaled_op(("batch1", "batch2"), _summed_bmm)
_addr = _scaled_op(("vec1", "vec2"), _outer_product)


def _in_place(handler, out_of_place):
    """Tensor.addmm_ and its kin: the quantized out-of-place result, copied into self."""
    def run(p, func, args, kwargs):
        if args[0].dtype != torch.float32 or torch.is_autocast_enabled("cpu"):
            return _fallback(p, func, args, kwargs, p.names.of_activations("matmul"),
                             "an in-place product into a tensor other than float32, or under autocast")
        return args[0].copy_(handler(p, out_of_place, args, kwargs))
    return run


def _linear(p, func, args, kwargs):
    c = _bind(args, kwargs, ("input", "weight", "bias"), {"bias": None})
    x, w, b = c["input"], c["weight"], c["bias"]
    name = p.names.of_weight(w) or p.names.of_activations("linear")
    if not _quantizable(x, w, b):
        return _fallback(p, func, args, kwargs, name, _dtype_reason(x, w, b))
    layer = p.layer(name)
    return func(*args, **kwargs) if layer is None else fn.linear(x, w, b, layer)


def _same_padding(kernel, dilation) -> Optional[List[int]]:
    totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
    return None if any(t % 2 for t in totals) else [t // 2 for t in totals]


def _as_list(v, n: int) -> list:
    return [v] * n if isinstance(v, int) else list(v)


def _conv(p, func, args, kwargs, dims: int):
    c = _bind(args, kwargs, ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
              {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1})
    x, w, b = c["input"], c["weight"], c["bias"]
    name = p.names.of_weight(w) or p.names.of_activations("conv")
    if not _quantizable(x, w, b):
        return _fallback(p, func, args, kwargs, name, _dtype_reason(x, w, b))
    stride, dilation = _as_list(c["stride"], dims), _as_list(c["dilation"], dims)
    padding = c["padding"]
    if padding == "valid":
        padding = [0] * dims
    elif padding == "same":
        padding = _same_padding(w.shape[2:], dilation)
        if padding is None:
            return _fallback(p, func, args, kwargs, name, "padding='same' with an even dilated kernel pads unevenly")
    padding = _as_list(padding, dims)
    if dims == 3 and _layer_products(p):
        return _fallback(p, func, args, kwargs, name, _COMPUTE_LAYER_ONLY)
    layer = p.layer(name)
    if layer is None:
        return func(*args, **kwargs)
    if dims == 3:
        return fn.conv(x, w, b, layer, stride, padding, dilation, c["groups"])
    if dims == 2:
        return fn.conv2d(x, w, b, layer, stride, padding, dilation, c["groups"])
    # A 1-d convolution is a 2-d one over a height of 1: the same products, the same blocks.
    y = fn.conv2d(x.unsqueeze(-2), w.unsqueeze(-2), b, layer, [1] + stride, [0] + padding, [1] + dilation,
                  c["groups"])
    return y.squeeze(-2)


def _bilinear(p, func, args, kwargs):
    """F.bilinear(x1, x2, W, b) as its two products: t = x1 W' (W' the weight laid out as a
    linear layer's, [O*J, I]: the weight quantizer), then t [.., O, J] times x2 [.., J, 1] (a
    product of activations, "<layer>.matmul"), plus the bias."""
    c = _bind(args, kwargs, ("input1", "input2", "weight", "bias"), {"bias": None})
    x1, x2, w, bias = c["input1"], c["input2"], c["weight"], c["bias"]
    name = p.names.of_parameter(w) or p.names.of_activations("bilinear")
    if not _quantizable(x1, x2, w, bias):
        return _fallback(p, func, args, kwargs, name, _dtype_reason(x1, x2, w, bias))
    if w.dim() != 3 or x1.dim() < 1 or x1.shape[:-1] != x2.shape[:-1] or (x1.shape[-1], x2.shape[-1]) != w.shape[1:]:
        return func(*args, **kwargs)  # torch's own error
    O, I, J = w.shape
    first, second = p.layer(name), p.layer(p.names.of_activations("matmul"))
    if first is None:
        return func(*args, **kwargs)
    t = fn.linear(x1, w.permute(0, 2, 1).reshape(O * J, I), None, first)
    y = fn.matmul(t.reshape(*x1.shape[:-1], O, J), x2.unsqueeze(-1), second).squeeze(-1)
    return y if bias is None else y + bias


_COMPUTE_LAYER_ONLY = ("compute and accumulate other than fp32 are modelled for linear layers, 2-d convolutions "
                       "and matmuls; this convolution's products would be float32")


def _layer_products(p: QuantizedProgram) -> bool:
    """Whether the context sends products through the compute layer (bf16, auto, chunked sums)."""
    ctx = p.state.context
    return ctx.compute != "fp32" or ctx.accumulate != "fp32"


def _conv_transpose(p, func, args, kwargs, dims: int):
    c = _bind(args, kwargs, ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"),
              {"bias": None, "stride": 1, "padding": 0, "output_padding": 0, "groups": 1, "dilation": 1})
    x, w, b = c["input"], c["weight"], c["bias"]
    name = p.names.of_parameter(w) or p.names.of_activations("conv_transpose")
    if not _quantizable(x, w, b):
        return _fallback(p, func, args, kwargs, name, _dtype_reason(x, w, b))
    if _layer_products(p):
        return _fallback(p, func, args, kwargs, name, _COMPUTE_LAYER_ONLY)
    if w.dim() != dims + 2 or x.dim() not in (dims + 1, dims + 2):
        return func(*args, **kwargs)  # torch's own error
    layer = p.layer(name)
    if layer is None:
        return func(*args, **kwargs)
    return fn.conv(x, w, b, layer, _as_list(c["stride"], dims), _as_list(c["padding"], dims),
                   _as_list(c["dilation"], dims), c["groups"], transposed=True,
                   output_padding=_as_list(c["output_padding"], dims))


def _attention_mask(scores, attn_mask, is_causal: bool):
    L, S = scores.shape[-2], scores.shape[-1]
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    return scores


def _sdpa(p, func, args, kwargs):
    c = _bind(args, kwargs, ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"),
              {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False})
    q, k, v = c["query"], c["key"], c["value"]
    if not _quantizable(q, k, v):
        return _fallback(p, func, args, kwargs, p.names.of_activations("scores"), _dtype_reason(q, k, v))
    scores_layer = p.layer(p.names.of_activations("scores"))
    context_layer = p.layer(p.names.of_activations("context"))
    if scores_layer is None:
        return func(*args, **kwargs)
    if c["enable_gqa"] and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scale = c["scale"] if c["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = fn.matmul(q * scale, k.transpose(-2, -1), scores_layer)
    attn = torch.softmax(_attention_mask(scores, c["attn_mask"], c["is_causal"]), dim=-1)
    if c["dropout_p"] > 0:
        attn = F.dropout(attn, p=c["dropout_p"])
    return fn.matmul(attn, v, context_layer)


# QuantMultiheadAttention's layers, in the order they run.
_ATTENTION_LAYERS = ("in_proj", "scores", "context", "out_proj")


def _attention_module(p: QuantizedProgram, mha: torch.nn.MultiheadAttention, path: str) -> QuantMultiheadAttention:
    """The QuantMultiheadAttention that runs `mha`'s products, with its layers named as
    quantize_model names them (in_proj, scores, context, out_proj)."""
    q = p.attention.get(id(mha))
    if q is None:
        q = QuantMultiheadAttention(mha)
        q.batch_first = False  # multi_head_attention_forward's inputs are sequence first
        for slot in _ATTENTION_LAYERS:
            getattr(q, slot).layer = p.layer(_join(path, slot))
        p.attention[id(mha)] = q
    q.train(mha.training)
    q.dropout = mha.dropout
    return q


def _multi_head_attention(p, func, args, kwargs):
    mha = p.names.stack[-1] if p.names.stack else None
    path = p.names.owner()
    if not isinstance(mha, torch.nn.MultiheadAttention):
        return _fallback(p, func, args, kwargs, _join(path, "multi_head_attention_forward"),
                         "multi_head_attention_forward called outside a torch.nn.MultiheadAttention")
    c = _bind(args, kwargs, ("query", "key", "value"), {"key_padding_mask": None, "need_weights": True,
                                                      "attn_mask": None, "average_attn_weights": True,
                                                      "is_causal": False})
    if mha.bias_k is not None or mha.add_zero_attn:
        return _fallback(p, func, args, kwargs, path, "add_bias_kv and add_zero_attn have no quantized op")
    if not _quantizable(c["query"], c["key"], c["value"]):
        return _fallback(p, func, args, kwargs, path, _dtype_reason(c["query"], c["key"], c["value"]))
    if p.discovering:
        for slot in _ATTENTION_LAYERS:
            p.layer(_join(path, slot))
        return func(*args, **kwargs)
    return _attention_module(p, mha, path)(c["query"], c["key"], c["value"], key_padding_mask=c["key_padding_mask"],
                                           need_weights=c["need_weights"], attn_mask=c["attn_mask"],
                                           average_attn_weights=c["average_attn_weights"], is_causal=c["is_causal"])


# -- einsum: pairwise products over letters ---------------------------------------------------

def _einsum_terms(equation: str, n: int) -> Optional[Tuple[List[str], str]]:
    """The operands' letters and the output's, or None for what is not taken apart here
    (an ellipsis, a letter twice in one operand)."""
    eq = equation.replace(" ", "")
    if "." in eq:
        return None
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n or any(len(set(t)) != len(t) for t in terms):
        return None
    if not arrow:
        counts = collections.Counter("".join(terms))
        out = "".join(sorted(ch for ch, k in counts.items() if k == 1))
    return terms, out


def _contract(p, a, ia: str, b, ib: str, keep: str):
    """The product of a (letters ia) and b (ib) keeping the letters in `keep`: (tensor, letters)."""
    sum_a = [i for i, ch in enumerate(ia) if ch not in ib and ch not in keep]
    sum_b = [i for i, ch in enumerate(ib) if ch not in ia and ch not in keep]
    if sum_a:
        a, ia = a.sum(sum_a), "".join(ch for i, ch in enumerate(ia) if i not in sum_a)
    if sum_b:
        b, ib = b.sum(sum_b), "".join(ch for i, ch in enumerate(ib) if i not in sum_b)
    batch = [ch for ch in ia if ch in ib and ch in keep]
    inner = [ch for ch in ia if ch in ib and ch not in keep]
    left = [ch for ch in ia if ch not in ib]
    right = [ch for ch in ib if ch not in ia]
    size = {**{ch: a.shape[i] for i, ch in enumerate(ia)}, **{ch: b.shape[i] for i, ch in enumerate(ib)}}
    numel = lambda letters: math.prod(size[ch] for ch in letters)  # noqa: E731
    a3 = a.permute([ia.index(ch) for ch in batch + left + inner]).reshape(numel(batch), numel(left), numel(inner))
    b3 = b.permute([ib.index(ch) for ch in batch + inner + right]).reshape(numel(batch), numel(inner), numel(right))
    if not batch:  # a 2-d product: a linear layer where one side is a parameter
        a3, b3 = a3[0], b3[0]
    prod = _einsum_product(p, a, a3, b, b3)
    shape = [size[ch] for ch in batch + left + right]
    return prod.reshape(shape), "".join(batch + left + right)


def _einsum_product(p, a, a2, b, b2):
    """a2 @ b2: a linear layer named by the parameter a or b is (2-d products), else a
    product of activations, "<module>.einsum"; plain torch while discovering."""
    nb = p.names.of_parameter(b) if a2.dim() == 2 else None
    na = p.names.of_parameter(a) if a2.dim() == 2 and nb is None else None
    layer = p.layer(nb or na or p.names.of_activations("einsum"))
    if layer is None:
        return torch.matmul(a2, b2)
    if nb is not None:
        return fn.linear(a2, b2.t(), None, layer)
    if na is not None:
        return fn.linear(b2.t(), a2, None, layer).t()
    return fn.matmul(a2, b2, layer)


def _expand_ellipsis(equation: str, operands: list) -> Optional[Tuple[str, list]]:
    """The equation with each "..." replaced by letters of its own (the broadcast dimensions,
    aligned from the right as einsum aligns them) and the operands expanded to the broadcast
    sizes; None where the equation is malformed (torch then says why)."""
    eq = equation.replace(" ", "")
    if "." not in eq:
        return eq, operands
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands) or any(t.replace("...", "", 1).count(".") for t in terms + [out]):
        return None
    counts = [op.dim() - (len(t) - 3) if "..." in t else 0 for t, op in zip(terms, operands)]
    if any(k < 0 for k in counts):
        return None
    free = [ch for ch in string.ascii_letters if ch not in eq]
    n = max(counts)
    ell = "".join(free[:n])
    shapes = [tuple(op.shape[t.index("..."):t.index("...") + k]) if "..." in t else () for t, op, k in
              zip(terms, operands, counts)]
    try:
        broadcast = torch.broadcast_shapes(*shapes)
    except RuntimeError:
        return None
    new_terms, new_ops = [], []
    for t, op, k in zip(terms, operands, counts):
        if "..." in t:
            i = t.index("...")
            op = op.expand(list(op.shape[:i]) + list(broadcast[n - k:]) + list(op.shape[i + k:]))
            t = t.replace("...", ell[n - k:])
        new_terms.append(t)
        new_ops.append(op)
    if not arrow:  # implicit output: the broadcast dimensions, then the letters used once, sorted
        once = collections.Counter("".join(terms).replace("...", ""))
        out = "..." + "".join(sorted(ch for ch, c in once.items() if c == 1))
    return ",".join(new_terms) + "->" + out.replace("...", ell), new_ops


def _einsum(p, func, args, kwargs):
    equation = args[0]
    operands = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
    if len(operands) < 2:
        return func(*args, **kwargs)  # one operand: a sum or a permutation, no product
    if isinstance(equation, str) and _quantizable(*operands):
        expanded = _expand_ellipsis(equation, operands)
        if expanded is None:
            return func(*args, **kwargs)  # torch's own error
        equation, operands = expanded
    terms = _einsum_terms(equation, len(operands)) if isinstance(equation, str) else None
    if not _quantizable(*operands) or terms is None or kwargs:
        why = (_dtype_reason(*operands) if not _quantizable(*operands) else
               "einsum's sublist form is not taken apart" if not isinstance(equation, str) else
               f"einsum '{equation}' is not taken apart (a letter twice in one operand: a diagonal)")
        return _fallback(p, func, args, kwargs, p.names.of_activations("einsum"), why)
    letters, out = terms
    cur, idx = operands[0], letters[0]
    for i in range(1, len(operands)):
        keep = out + "".join(letters[i + 1:])
        cur, idx = _contract(p, cur, idx, operands[i], letters[i], keep)
    extra = [i for i, ch in enumerate(idx) if ch not in out]
    if extra:
        cur, idx = cur.sum(extra), "".join(ch for ch in idx if ch in out)
    return cur.permute([idx.index(ch) for ch in out]) if idx != out else cur


def _grouped_mm(p, func, args, kwargs):
    """A grouped product (mixture-of-experts layers): rows offs[i-1]:offs[i] of a 2-d input
    times b[i], each group a call of the layer the weight bank names."""
    c = _bind(args, kwargs, ("mat_a", "mat_b"), {"offs": None, "bias": None, "out_dtype": None})
    a, b, offs = c["mat_a"], c["mat_b"], c["offs"]
    name = p.names.of_parameter(b) or p.names.of_activations("grouped_mm")
    if not _quantizable(a, b) or c["out_dtype"] not in (None, torch.float32):
        return _fallback(p, func, args, kwargs, name, _dtype_reason(a, b))
    if a.dim() != 2 or b.dim() != 3 or offs is None or c["bias"] is not None:
        return _fallback(p, func, args, kwargs, name, "a grouped product other than 2-d input, 3-d weights, offs")
    pieces, start = [], 0
    for i, end in enumerate(offs.tolist()):
        part = a[start:end]
        prod = _product(p, part, b[i]) if end > start else part.new_zeros(0, b.shape[-1])
        if prod is None:  # discovering
            return func(*args, **kwargs)
        pieces.append(prod)
        start = end
    if start < a.shape[0]:  # rows past the last offset: zeros, as torch leaves them
        pieces.append(a.new_zeros(a.shape[0] - start, b.shape[-1]))
    return torch.cat(pieces)


def _handlers() -> dict:
    h = {}
    for f in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.mm,
              torch.Tensor.mm, torch.bmm, torch.Tensor.bmm):
        h[f] = _matmul
    for f in (torch.addmm, torch.Tensor.addmm):
        h[f] = _addmm
    for f in (torch.baddbmm, torch.Tensor.baddbmm):
        h[f] = _baddbmm
    h[F.linear] = _linear
    h[F.conv2d] = lambda p, f, a, k: _conv(p, f, a, k, 2)
    h[F.conv1d] = lambda p, f, a, k: _conv(p, f, a, k, 1)
    h[F.conv3d] = lambda p, f, a, k: _conv(p, f, a, k, 3)
    for dims, f in ((1, F.conv_transpose1d), (2, F.conv_transpose2d), (3, F.conv_transpose3d)):
        h[f] = lambda p, func, a, k, dims=dims: _conv_transpose(p, func, a, k, dims)
    for fs, handler in (((torch.mv, torch.Tensor.mv), _mv), ((torch.dot, torch.Tensor.dot, torch.vdot), _dot),
                        ((torch.outer, torch.Tensor.outer, torch.ger, torch.Tensor.ger), _outer),
                        ((torch.inner, torch.Tensor.inner), _inner), ((torch.tensordot,), _tensordot),
                        ((torch.linalg.multi_dot, torch.chain_matmul), _multi_dot),
                        ((torch.addmv, torch.Tensor.addmv), _addmv), ((torch.addbmm, torch.Tensor.addbmm), _addbmm),
                        ((torch.addr, torch.Tensor.addr), _addr), ((F.bilinear,), _bilinear)):
        for f in fs:
            h[f] = handler
    for name, handler in (("addmm", _addmm), ("baddbmm", _baddbmm), ("addmv", _addmv), ("addbmm", _addbmm),
                          ("addr", _addr)):
        h[getattr(torch.Tensor, name + "_")] = _in_place(handler, getattr(torch, name))
    h[F.scaled_dot_product_attention] = _sdpa
    h[F.multi_head_attention_forward] = _multi_head_attention
    h[torch.einsum] = _einsum
    for f in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None)):
        if f is not None:
            h[f] = _grouped_mm
    return h


_HANDLERS = _handlers()


def quantized(model: torch.nn.Module, recipe=None, *, seed: int = 0, compute: Optional[str] = None,
              accumulate: Optional[str] = None, stats_interval: int = 0, save_codes: bool = True) -> QuantizedProgram:
    """A context manager that quantizes with `recipe` every product run inside it: the
    model's modules, functional calls (F.linear, F.conv1d/2d/3d, F.conv_transpose1d/2d/3d,
    F.bilinear, torch.matmul, @,
    mm, bmm, mv, dot, outer, inner, tensordot, multi_dot, addmm, baddbmm, addbmm, addmv,
    addr, einsum, F.scaled_dot_product_attention, multi-head attention) and any code they
    call, named by module path and parameter (module docstring).

        step = fp8lab.torch.quantized(model, "nvfp4")
        for x, y in data:
            with step:
                loss = F.cross_entropy(model(x), y)
            loss.backward()

    Calling quantized() again on the same model returns the same program (its recipe must
    then be the same or left out; recipe=None is float32 for a model not quantized yet). Products that run unquantized inside it are counted
    with their reasons in quant_state(model).unquantized and named in a warning after the
    first training forward. seed, compute, accumulate, stats_interval, save_codes: as for
    quantize_model. The model itself is not changed, but for forward hooks while inside."""
    program = getattr(model, "_fp8lab_program", None) if isinstance(model, torch.nn.Module) else None
    if program is not None:
        if recipe is not None and _recipe(recipe) != program.recipe:
            raise ValueError(f"this model is quantized already with recipe {program.state.recipe!r}")
        return program
    return QuantizedProgram(model, "fp32" if recipe is None else recipe, seed=seed, compute=compute, accumulate=accumulate,
                            stats_interval=stats_interval, save_codes=save_codes)
