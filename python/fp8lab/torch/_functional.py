"""Quantized products as functions: the C++ library's autograd functions (docs/spec.md §4).

    y = f(Q_a(x), Q_w(w)) + b         dL/dx = f_x'(Q_gx(g), Q_w(w))
    dL/dw = Q_gw(f_w'(Q_a(x), Q_gx(g)))   dL/db = sum of g (float32)

`layer` is a LayerState: its quantizers, its stochastic-rounding streams (fresh per step
and call), its counts and statistics. The tensors saved for backward are the 8-bit codes
of Q_a(x), decoded in backward; gradients are quantized in their own memory where nothing
else holds them.
"""
from __future__ import annotations

import functools

from typing import Optional, Sequence, Union

import torch

from .. import _core
from . import _compiled

LayerState = _core.LayerState
QuantContext = _core.QuantContext

# Values that float32 holds exactly: their products are quantized from float32 copies.
_EXACT_IN_FLOAT32 = (torch.bfloat16, torch.float16)


def _result_dtype(what: str, tensors) -> torch.dtype:
    """The dtype of a product's result: autocast's where it is on (torch.autocast's lower
    precision products), else its operands' one dtype (float32, bfloat16 or float16)."""
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    kinds = {t.dtype for t in tensors}
    if len(kinds) > 1:
        raise TypeError(f"{what}: operands of {' and '.join(sorted(str(k).replace('torch.', '') for k in kinds))}; "
                        "give them one dtype or run under torch.autocast, as torch requires")
    return kinds.pop() if kinds else torch.float32


def _in_float32(op):
    """`op` (one of the quantized products below) for bfloat16 and float16 operands and under
    torch.autocast: the operands' float32 copies (exact) are quantized and multiplied with
    autocast off, and the result is rounded to the dtype torch's own product would give, so
    that its gradient comes back in the operands' dtypes. float32 operands outside autocast
    go straight through; anything else (float64) reaches the C++ op, which refuses it."""
    def run(*args, **kwargs):
        if torch.jit.is_tracing():
            raise RuntimeError(f"fp8lab.torch.{op.__name__}: torch.jit.trace cannot record fp8lab's quantized products "
                               "(C++ autograd functions outside TorchScript: the trace would hold their outputs as "
                               "constants); trace or export the float32 model")
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        low = any(t.dtype in _EXACT_IN_FLOAT32 for t in tensors)
        if not low and not torch.is_autocast_enabled("cpu"):
            return op(*args, **kwargs)
        if any(t.dtype not in _EXACT_IN_FLOAT32 + (torch.float32,) for t in tensors):
            return op(*args, **kwargs)  # the C++ op's own refusal names the dtype
        out = _result_dtype(op.__name__, tensors)
        up = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
        with torch.autocast("cpu", enabled=False):
            y = op(*up, **kwargs)
        return y if out == torch.float32 else y.to(out)
    # Eagerly, the C++ autograd functions; while torch.compile traces, the same products as
    # custom operators (_compiled): no graph break, eager's bits. Where torch lacks those
    # operators, torch.compile runs the product eagerly (a graph break).
    # (`run` is not made a wrapper of `op`: torch.compiler.disable marks what it unwraps to.)
    unseen = torch.compiler.disable(run, recursive=True)

    def product(*args, **kwargs):
        if not torch.compiler.is_compiling() or _compiled.AVAILABLE:
            return run(*args, **kwargs)
        return unseen(*args, **kwargs)
    return functools.update_wrapper(product, op)


def _tracing() -> bool:
    """Whether torch.compile is tracing, and the products have their custom operators."""
    return _compiled.AVAILABLE and torch.compiler.is_compiling()


def _products():
    """The C++ products: autograd functions eagerly, custom operators while torch.compile
    traces (python/fp8lab/torch/_compiled.py)."""
    return _compiled if _tracing() else _core


def context(*, seed: int = 0, compute: str = "fp32", accumulate: str = "fp32", stats_interval: int = 0,
            save_codes: bool = True) -> QuantContext:
    """The state every quantized layer of a model shares: the run seed, the step number
    (stochastic rounding streams derive from both), the compute path of the products
    (fp32, auto or bf16, docs/spec.md §7), their accumulation (fp32, FORMAT@CHUNK or a dot model such as hopper-fp8) and how
    often statistics are recorded (every N steps; 0: never)."""
    return QuantContext(seed=seed, compute=compute, accumulate=accumulate, stats_interval=stats_interval,
                        save_codes=save_codes)


def layer(name: str, ctx: Optional[QuantContext] = None, *, index: int = 0, a: str = "fp32", w: str = "fp32",
          gx: str = "fp32", gw: str = "fp32") -> LayerState:
    """A LayerState with quantizers given per kind: a format, a scaled format or fp32, with an
    optional /ROUNDING and /OVERFLOW ("1.5.2:24/stochastic", "mxfp8_e4m3", "e5m2/rne/nan")."""
    q = _core.layer_quant({"a": a, "w": w, "gx": gx, "gw": gw})
    return LayerState(name, q, ctx if ctx is not None else context(), index)


@_in_float32
def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], layer: LayerState) -> torch.Tensor:
    """torch.nn.functional.linear with quantized operands and gradients."""
    return _products().quant_linear(x, weight, bias, layer)


def _pair(v: Union[int, Sequence[int]], name: str, least: int) -> list:
    """A conv2d argument as [h, w], each an integer >= least (ValueError or TypeError naming it)."""
    items = [v, v] if isinstance(v, int) else list(v) if isinstance(v, (tuple, list)) else None
    if items is None or len(items) != 2 or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise TypeError(f"conv2d: {name}={v!r}: expected an integer or two")
    if min(items) < least:
        raise ValueError(f"conv2d: {name}={v!r}: each must be at least {least}")
    return items


@_in_float32
def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], layer: LayerState, stride=1,
           padding=0, dilation=1, groups: int = 1) -> torch.Tensor:
    """torch.nn.functional.conv2d (NCHW or unbatched CHW, numeric padding) with quantized
    operands and gradients."""
    if isinstance(padding, str):
        raise ValueError(f"conv2d: padding={padding!r}; give the padding as numbers "
                         "(QuantConv2d converts 'same' and 'valid')")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"conv2d: groups={groups!r}: expected an integer >= 1")
    unbatched = x.dim() == 3
    y = _products().quant_conv2d(x.unsqueeze(0) if unbatched else x, weight, bias, _pair(stride, "stride", 1),
                                 _pair(padding, "padding", 0), _pair(dilation, "dilation", 1), groups, layer)
    return y.squeeze(0) if unbatched else y


def _axes(v: Union[int, Sequence[int]], name: str, least: int, n: int) -> list:
    """A convolution argument as n integers >= least (ValueError or TypeError naming it)."""
    items = [v] * n if isinstance(v, int) else list(v) if isinstance(v, (tuple, list)) else None
    if items is None or len(items) not in (1, n) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                            for i in items):
        raise TypeError(f"conv: {name}={v!r}: expected an integer or {n}")
    if min(items) < least:
        raise ValueError(f"conv: {name}={v!r}: each must be at least {least}")
    return items * n if len(items) == 1 else items


@_in_float32
def conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], layer: LayerState, stride=1,
         padding=0, dilation=1, groups: int = 1, *, transposed: bool = False, output_padding=0) -> torch.Tensor:
    """torch's convolutions of 1 to 3 spatial dimensions (F.conv1d/2d/3d, or with
    transposed=True F.conv_transpose1d/2d/3d; [N, C, S...] or unbatched [C, S...], numeric
    padding) with quantized operands and gradients; the products in float32. The weight
    quantizer's blocks run along a weight's reduction: input channels and kernel positions
    forward."""
    if isinstance(padding, str):
        raise ValueError(f"conv: padding={padding!r}; give the padding as numbers")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"conv: groups={groups!r}: expected an integer >= 1")
    n = weight.dim() - 2
    if not 1 <= n <= 3:
        raise ValueError(f"conv: a weight of {weight.dim()} dimensions; convolutions take 3 to 5")
    unbatched = x.dim() == n + 1
    y = _products().quant_conv(x.unsqueeze(0) if unbatched else x, weight, bias, _axes(stride, "stride", 1, n),
                               _axes(padding, "padding", 0, n), _axes(dilation, "dilation", 1, n), transposed,
                               _axes(output_padding, "output_padding", 0, n), groups, layer)
    return y.squeeze(0) if unbatched else y


@_in_float32
def matmul(a: torch.Tensor, b: torch.Tensor, layer: LayerState) -> torch.Tensor:
    """torch.matmul of two activations (attention's Q K^T and A V): both operands take the
    activation quantizer, the gradients grad_x's."""
    return _products().quant_matmul(a, b, layer)
