#!/usr/bin/env python3
"""A small attention model in plain PyTorch, trained in 8 bits by fp8lab with the lines
marked "fp8lab": a two-layer Transformer encoder (torch.nn.TransformerEncoderLayer, whose
torch.nn.MultiheadAttention fp8lab replaces) plus one attention head written by hand with
torch.matmul and `@` (which fp8lab finds by tracing the model with torch.fx), learning to
reverse sequences of tokens.

    python3 examples/python/attention.py                             # float32 and 8 bits, side by side
    python3 examples/python/attention.py --recipe transformer-mixed --steps 600
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import Progress, use_cores

import fp8lab.torch as ft  # fp8lab


class HandWrittenAttention(nn.Module):
    """Single-head self-attention as people write it: products with torch.matmul and @."""

    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.d = d

    def forward(self, x):
        qkv = self.qkv(x)
        q, k, v = qkv[..., :self.d], qkv[..., self.d:2 * self.d], qkv[..., 2 * self.d:]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d)
        return x + self.out(torch.softmax(scores, dim=-1) @ v)


class Reverser(nn.Module):
    def __init__(self, vocab, length, d=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(length, d))
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True), layers)
        self.attn = HandWrittenAttention(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.attn(self.encoder(self.embed(tokens) + self.pos)))


def batch(n, length, vocab, gen):
    x = torch.randint(0, vocab, (n, length), generator=gen)
    return x, x.flip(1)


def train(recipe, a):
    torch.manual_seed(a.seed)
    model = Reverser(a.vocab, a.length)
    if recipe != "fp32":
        model = ft.quantize_model(model, recipe, seed=a.seed)  # fp8lab
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    scaler = ft.LossScaler(a.loss_scale, recipe=recipe if recipe != "fp32" else None)  # fp8lab
    gen = torch.Generator().manual_seed(a.seed)
    bar = Progress(a.steps)
    for step in range(1, a.steps + 1):
        x, y = batch(a.batch, a.length, a.vocab, gen)
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, a.vocab), y.reshape(-1))
        scaler.scale(loss).backward()  # fp8lab
        scaler.step(opt)  # fp8lab
        scaler.update()  # fp8lab
        bar.update(step, f"{recipe} loss {loss.item():.3f}")
    model.eval()
    with torch.no_grad():
        x, y = batch(2000, a.length, a.vocab, torch.Generator().manual_seed(12345))
        acc = (model(x).argmax(-1) == y).float().mean().item() * 100
    return model, acc


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="a=1.4.3:10,w=1.4.3:14,gx=1.5.2:24,gw=fp32",
                   help="the 8-bit recipe (a preset, a line or a .toml file)")
    p.add_argument("--loss-scale", default="none")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=8)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    use_cores(a.threads)
    results = {}
    for recipe in ("fp32", a.recipe):
        model, acc = train(recipe, a)
        results[recipe] = acc
        if recipe != "fp32":
            st = ft.quant_state(model)
            print(f"{len(st.layers)} quantized layers ({st.traced}); attention products:",
                  ", ".join(p for p in st.layers if p.endswith(("scores", "context")) or "matmul" in p))
    for recipe, acc in results.items():
        print(f"{recipe}: token accuracy {acc:.1f} %")


if __name__ == "__main__":
    main()
