"""fp8lab's quantized products as torch custom operators, for torch.compile (docs/python.md,
"torch.compile").

Eagerly, a quantized product is one of the C++ library's autograd functions. torch.compile
cannot look inside those, so while it traces, the products of fp8lab.torch (linear, conv2d,
conv, matmul) run as the custom operators below instead, each with a fake implementation
that gives its output's shape: a quantized model compiles to whole graphs, with no graph
break at its products.

    fp8lab::linear(x, w, b, layer) -> (y, handle)          and conv2d, conv, matmul
    fp8lab::product_backward(grad, handle, needs, shapes, ranks) -> gradients

The forward runs the C++ op's own forward code (nn::quant_*_forward) and returns what its
backward needs as `handle`, a 0-d int64 tensor that owns it: torch.compile saves the handle
for the backward like any other tensor, and what it holds is freed with it. The backward runs
the C++ op's own backward. Same quantizers, streams, counts and statistics as eagerly: the
results are eager's bit for bit.

`layer` is a key for the LayerState (`key_of`), taken as a constant when the graph is traced:
a compiled graph keeps the LayerStates its modules held when it was traced.

A quantized model's step bookkeeping (QuantState's forward hooks: the step number, evaluation
under its own step) runs as `fp8lab::state_event`. It and the forward operators are ordered
effects (torch._higher_order_ops.effects): the compiled graph runs them in program order, as
eagerly, and never drops one.
"""
from __future__ import annotations

import itertools
import weakref
from typing import List, Optional, Sequence, Tuple

import torch

from .. import _core

try:  # torch 2.13 is the release tested; an older 2.x without these compiles with graph breaks
    from torch._higher_order_ops.effects import _EffectType, _register_effectful_op
    AVAILABLE = hasattr(torch.library, "custom_op")
except ImportError:
    AVAILABLE = False

# The LayerStates and QuantStates that compiled code names, by key, held weakly both ways.
_HELD: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_KEY_OF: "weakref.WeakKeyDictionary[object, int]" = weakref.WeakKeyDictionary()
_NEXT_KEY = itertools.count(1)


def _key(obj) -> int:
    key = _KEY_OF.get(obj)
    if key is None:
        key = next(_NEXT_KEY)
        _KEY_OF[obj] = key
        _HELD[key] = obj
    return key


@torch._dynamo.assume_constant_result
def key_of(layer: _core.LayerState) -> int:
    """The key the custom ops name a LayerState by (one per LayerState, for its life)."""
    if not isinstance(layer, _core.LayerState):
        raise TypeError(f"expected a LayerState, got {type(layer).__name__}")
    return _key(layer)


@torch._dynamo.assume_constant_result
def state_key(state) -> int:
    """The key state_event names a QuantState by."""
    return _key(state)


def _held(key: int):
    obj = _HELD.get(key)
    if obj is None:
        raise RuntimeError(f"fp8lab: compiled code names key {key}, whose LayerState or QuantState is gone; "
                           "compile the model again after converting it again")
    return obj


def _handle_like(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty((), dtype=torch.int64)


def _split(shapes: Sequence[int], ranks: Sequence[int]) -> List[List[int]]:
    """The shapes of a product's tensor inputs, from their sizes in a row and their ranks."""
    out, at = [], 0
    for r in ranks:
        out.append(list(shapes[at:at + r]))
        at += r
    return out


def _setup(count: int):
    """setup_context of a forward operator whose first `count` arguments are its tensors."""
    def setup(ctx, inputs, output):
        tensors = inputs[:count]
        ctx.save_for_backward(output[1])
        ctx.ranks = [t.dim() if t is not None else 0 for t in tensors]
        ctx.shapes = [s for t in tensors if t is not None for s in t.shape]
        ctx.inputs, ctx.args = count, len(inputs)
    return setup


def _backward(ctx, grad, _handle_grad):
    if grad is None:
        return (None,) * ctx.args
    handle, = ctx.saved_tensors
    needs = [bool(n) for n in ctx.needs_input_grad[:ctx.inputs]]
    grads = torch.ops.fp8lab.product_backward(grad, handle, needs, ctx.shapes, ctx.ranks)
    return tuple(g if n else None for g, n in zip(grads, needs)) + (None,) * (ctx.args - ctx.inputs)


def _define_products() -> None:
    """fp8lab::linear, conv2d, conv and matmul, their backward and their autograd. Outputs are
    made contiguous, as their fake implementations say they are."""
    @torch.library.custom_op("fp8lab::linear", mutates_args=())
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], layer: int
               ) -> Tuple[torch.Tensor, torch.Tensor]:
        y, handle = _core.quant_linear_forward(x, weight, bias, _held(layer))
        return y.contiguous(), handle

    @linear.register_fake
    def _(x, weight, bias, layer):
        return x.new_empty((*x.shape[:-1], weight.shape[0])), _handle_like(x)

    @torch.library.custom_op("fp8lab::conv2d", mutates_args=())
    def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: List[int],
               padding: List[int], dilation: List[int], groups: int, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        y, handle = _core.quant_conv2d_forward(x, weight, bias, stride, padding, dilation, groups, _held(layer))
        return y.contiguous(), handle

    @conv2d.register_fake
    def _(x, weight, bias, stride, padding, dilation, groups, layer):
        y = torch.ops.aten.convolution.default(x, weight, None, stride, padding, dilation, False, [0, 0], groups)
        return y.contiguous(), _handle_like(x)

    @torch.library.custom_op("fp8lab::conv", mutates_args=())
    def conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: List[int],
             padding: List[int], dilation: List[int], transposed: bool, output_padding: List[int], groups: int,
             layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        y, handle = _core.quant_conv_forward(x, weight, bias, stride, padding, dilation, transposed, output_padding,
                                             groups, _held(layer))
        return y.contiguous(), handle

    @conv.register_fake
    def _(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, layer):
        y = torch.ops.aten.convolution.default(x, weight, None, stride, padding, dilation, transposed,
                                               output_padding, groups)
        return y.contiguous(), _handle_like(x)

    @torch.library.custom_op("fp8lab::matmul", mutates_args=())
    def matmul(a: torch.Tensor, b: torch.Tensor, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        y, handle = _core.quant_matmul_forward(a, b, _held(layer))
        return y.contiguous(), handle

    @matmul.register_fake
    def _(a, b, layer):
        return torch.matmul(a, b).contiguous(), _handle_like(a)

    @torch.library.custom_op("fp8lab::product_backward", mutates_args=())
    def product_backward(grad: torch.Tensor, handle: torch.Tensor, needs: List[bool], shapes: List[int],
                         ranks: List[int]) -> List[torch.Tensor]:
        grads = _core.quant_backward(grad, handle, needs)
        return [g.contiguous() if g is not None else grad.new_empty((0,)) for g in grads]

    @product_backward.register_fake
    def _(grad, handle, needs, shapes, ranks):
        return [grad.new_empty(s if need else (0,)) for need, s in zip(needs, _split(shapes, ranks))]

    for op, inputs in ((linear, 3), (conv2d, 3), (conv, 3), (matmul, 2)):
        op.register_autograd(_backward, setup_context=_setup(inputs))
        _register_effectful_op(op, _EffectType.ORDERED)


def _define_state_event() -> None:
    """fp8lab::state_event(state, event, layer): QuantState `state`'s hook `event` (its
    _event), for the module of LayerState `layer` (0: the model)."""
    @torch.library.custom_op("fp8lab::state_event", mutates_args=())
    def state_event(state: int, event: str, layer: int) -> None:
        _held(state)._event(event, _held(layer) if layer else None)

    @state_event.register_fake
    def _(state, event, layer):
        return None

    _register_effectful_op(state_event, _EffectType.ORDERED)


if AVAILABLE:
    _define_products()
    _define_state_event()


# ---- what fp8lab.torch calls while torch.compile traces -----------------------------------

def state_event(state, event: str, layer=None) -> None:
    torch.ops.fp8lab.state_event(state_key(state), event, key_of(layer) if layer is not None else 0)


# fp8lab.torch's products call these in place of _core's.
def quant_linear(x, weight, bias, layer):
    return torch.ops.fp8lab.linear(x, weight, bias, key_of(layer))[0]


def quant_conv2d(x, weight, bias, stride, padding, dilation, groups, layer):
    return torch.ops.fp8lab.conv2d(x, weight, bias, stride, padding, dilation, groups, key_of(layer))[0]


def quant_conv(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, layer):
    return torch.ops.fp8lab.conv(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                                 key_of(layer))[0]


def quant_matmul(a, b, layer):
    return torch.ops.fp8lab.matmul(a, b, key_of(layer))[0]
