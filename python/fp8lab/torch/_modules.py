"""Quantized layers as torch.nn.Modules, drop-in for torch.nn.Linear, Conv2d and
MultiheadAttention: the same parameters (names, shapes, initialisation, state_dict keys),
float32 until a recipe gives them a LayerState (quantize_model does)."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from . import _functional as fn


def _label(kind: str, layer) -> str:
    """How an error names a converted layer: by its layer name, or as left float32."""
    return f"{kind} '{layer.name}'" if layer is not None else f"{kind} (float32)"


def _describe(layer) -> str:
    if layer is None:
        return "float32"
    q = layer.quant.as_dict()
    return ", ".join(f"{k}={v}" for k, v in q.items())


class QuantLinear(torch.nn.Linear):
    """torch.nn.Linear whose products run through fp8lab's quantized linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, layer=None):
        super().__init__(in_features, out_features, bias)
        self.layer = layer

    @classmethod
    def adopt(cls, m: torch.nn.Linear, layer=None) -> "QuantLinear":
        """A QuantLinear holding m's own parameter tensors (an optimizer over m's parameters
        keeps working)."""
        q = cls.__new__(cls)
        torch.nn.Module.__init__(q)
        q.in_features, q.out_features = m.in_features, m.out_features
        q.weight = m.weight
        q.bias = m.bias
        q.layer = layer
        q.train(m.training)
        return _keep_hooks(m, q)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{_label('QuantLinear', self.layer)}: the input's last dimension is "
                             f"{x.shape[-1] if x.dim() else 'missing (a 0-d tensor)'}, the layer takes "
                             f"{self.in_features} features (input shape {tuple(x.shape)})")
        if self.layer is None:
            return F.linear(x, self.weight, self.bias)
        return fn.linear(x, self.weight, self.bias, self.layer)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {_describe(self.layer)}"


# A module's hooks (forward, pre-forward, backward, state dict): shared with its replacement,
# so that hooks registered before the conversion fire after it and their handles still remove them.
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
               "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def _keep_hooks(old: torch.nn.Module, new: torch.nn.Module) -> torch.nn.Module:
    for name in _HOOK_DICTS:
        if hasattr(old, name):
            setattr(new, name, getattr(old, name))
    if hasattr(old, "_is_full_backward_hook"):
        new._is_full_backward_hook = old._is_full_backward_hook
    return new


class QuantConv2d(torch.nn.Conv2d):
    """torch.nn.Conv2d whose products run through fp8lab's quantized convolution."""

    def __init__(self, *args, layer=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.layer = layer

    @classmethod
    def adopt(cls, m: torch.nn.Conv2d, layer=None) -> "QuantConv2d":
        q = cls.__new__(cls)
        torch.nn.Module.__init__(q)
        for a in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "transposed",
                  "output_padding", "groups", "padding_mode", "_reversed_padding_repeated_twice"):
            setattr(q, a, getattr(m, a))
        q.weight = m.weight
        q.bias = m.bias
        q.layer = layer
        q.train(m.training)
        return _keep_hooks(m, q)

    def _numeric_padding(self):
        if not isinstance(self.padding, str):
            return list(self.padding)
        if self.padding == "valid":
            return [0, 0]
        # 'same' (stride 1): torch pads (total // 2) before and the rest after; equal sides
        # when every dilation * (kernel - 1) is even.
        totals = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)]
        if any(t % 2 for t in totals):
            raise ValueError("QuantConv2d: padding='same' with an even dilated kernel pads unevenly; "
                             "pad the input with F.pad and use numeric padding")
        return [t // 2 for t in totals]

    def _check_input(self, x: torch.Tensor) -> None:
        name = _label("QuantConv2d", self.layer)
        if x.dim() not in (3, 4) or x.shape[-3] != self.in_channels:
            raise ValueError(f"{name}: expected an input [N, {self.in_channels}, H, W] or [{self.in_channels}, H, W], "
                             f"got shape {tuple(x.shape)}")
        if isinstance(self.padding, str):
            return
        for size, pad, dil, k in zip(x.shape[-2:], self.padding, self.dilation, self.kernel_size):
            if size + 2 * pad < dil * (k - 1) + 1:
                raise ValueError(f"{name}: the input's {tuple(x.shape[-2:])} positions, padded by "
                                 f"{tuple(self.padding)}, are smaller than the dilated kernel "
                                 f"{tuple(d * (k - 1) + 1 for d, k in zip(self.dilation, self.kernel_size))}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        if self.layer is None:
            return super().forward(x)
        padding = self._numeric_padding()
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = [0, 0]
        return fn.conv2d(x, self.weight, self.bias, self.layer, self.stride, padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {_describe(self.layer)}"


class QuantMatmul(torch.nn.Module):
    """torch.matmul of two activations as a module (what quantize_model puts in place of
    `a @ b`, torch.matmul and torch.bmm in a traced model)."""

    def __init__(self, layer=None):
        super().__init__()
        self.layer = layer

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.layer is None:
            return torch.matmul(a, b)
        return fn.matmul(a, b, self.layer)

    def extra_repr(self) -> str:
        return _describe(self.layer)


class LayerSlot(torch.nn.Module):
    """Holds the LayerState of products a parent module runs itself (the input projection
    of QuantMultiheadAttention), so that the layer has a module path like any other."""

    def __init__(self, layer=None):
        super().__init__()
        self.layer = layer

    def extra_repr(self) -> str:
        return _describe(self.layer)


class QuantMultiheadAttention(torch.nn.Module):
    """torch.nn.MultiheadAttention with quantized products: the input projection (layer
    `in_proj`), the scores Q K^T (`scores`), the context A V (`context`) and the output
    projection (`out_proj`). It holds the attention module's own parameters and takes the
    same arguments (batch_first, key_padding_mask, attn_mask, need_weights,
    average_attn_weights, is_causal: with attn_mask given, a hint that it is causal, as in
    torch; without one, the causal mask); add_bias_kv and add_zero_attn are not supported."""

    def __init__(self, mha: torch.nn.MultiheadAttention):
        super().__init__()
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("QuantMultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        # torch.nn.MultiheadAttention's attributes, which code around attention reads.
        self.embed_dim, self.num_heads, self.head_dim = mha.embed_dim, mha.num_heads, mha.head_dim
        self.kdim, self.vdim = mha.kdim, mha.vdim
        self.batch_first, self.dropout = mha.batch_first, mha.dropout
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self.packed = self._qkv_same_embed_dim = mha._qkv_same_embed_dim
        if self.packed:
            self.in_proj_weight = mha.in_proj_weight
        else:
            self.q_proj_weight, self.k_proj_weight, self.v_proj_weight = (
                mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        self.in_proj_bias = mha.in_proj_bias
        # Registered in the order they run: model order of the quantized layers.
        self.in_proj = LayerSlot()
        self.scores = QuantMatmul()
        self.context = QuantMatmul()
        self.out_proj = QuantLinear.adopt(mha.out_proj)
        self.train(mha.training)

    def _weights(self):
        E = self.embed_dim
        if self.packed:
            w = self.in_proj_weight
            ws = (w[:E], w[E:2 * E], w[2 * E:])
        else:
            ws = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        b = self.in_proj_bias
        bs = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        return ws, bs

    def _project(self, x, w, b):
        layer = self.in_proj.layer
        return F.linear(x, w, b) if layer is None else fn.linear(x, w, b, layer)

    def forward(self, query, key, value, key_padding_mask: Optional[torch.Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[torch.Tensor] = None, average_attn_weights: bool = True, is_causal: bool = False):
        batched = query.dim() == 3
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:  # as torch does it: self-attention stays one packed projection
            if query is key and key is value:
                query = key = value = query.transpose(0, 1)
            elif key is value:
                query, key = query.transpose(0, 1), key.transpose(0, 1)
                value = key
            else:
                query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        L, N, E = query.shape
        S = key.shape[0]
        h, d = self.num_heads, self.head_dim
        (wq, wk, wv), (bq, bk, bv) = self._weights()
        if self.packed and query is key and key is value:
            q, k, v = self._project(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        else:
            q, k, v = self._project(query, wq, bq), self._project(key, wk, bk), self._project(value, wv, bv)
        q = q.reshape(L, N * h, d).transpose(0, 1) / math.sqrt(d)
        k = k.reshape(S, N * h, d).transpose(0, 1)
        v = v.reshape(S, N * h, d).transpose(0, 1)
        scores = self.scores(q, k.transpose(1, 2))  # [N h, L, S]
        if is_causal and attn_mask is None:  # torch's hint without its mask: the causal one
            attn_mask = torch.ones(L, S, dtype=torch.bool, device=scores.device).triu(1)
        mask = self._mask(attn_mask, key_padding_mask, N, L, S, scores.dtype)
        if mask is not None:
            scores = scores + mask
        attn = torch.softmax(scores, dim=-1)
        if self.training and self.dropout > 0:
            attn = F.dropout(attn, p=self.dropout)
        out = self.context(attn, v)  # [N h, L, d]
        out = self.out_proj(out.transpose(0, 1).reshape(L * N, E)).view(L, N, E)
        if self.batch_first and batched:
            out = out.transpose(0, 1)
        if not batched:
            out = out.squeeze(1)
        if not need_weights:
            return out, None
        w = attn.view(N, h, L, S)
        if average_attn_weights:
            w = w.mean(dim=1)
        return out, (w if batched else w.squeeze(0))

    def _mask(self, attn_mask, key_padding_mask, N, L, S, dtype):
        """The additive mask [N h, L, S] (or broadcastable), -inf where attention is barred."""
        h = self.num_heads
        mask = None
        if attn_mask is not None:
            m = attn_mask
            if m.dtype == torch.bool:
                m = torch.zeros_like(m, dtype=dtype).masked_fill(m, float("-inf"))
            mask = m.view(1, L, S) if m.dim() == 2 else m.view(N * h, L, S)
        if key_padding_mask is not None:
            k = key_padding_mask
            if k.dtype == torch.bool:
                k = torch.zeros_like(k, dtype=dtype).masked_fill(k, float("-inf"))
            k = k.view(N, 1, 1, S).expand(N, h, 1, S).reshape(N * h, 1, S)
            mask = k if mask is None else mask + k
        return mask

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"
