#!/usr/bin/env python3
"""A transformers Llama learns the King James Bible in float32, in the paper's 8-bit recipe
and in NVFP4: the same model, data and seed, its every product quantized by the lines
marked "fp8lab". Bytes are the tokens (a vocabulary of 256, no tokenizer to train); the
verses of the corpus's train split read as one stream, cut into blocks. Prints the
validation loss of each run and plots the three loss curves (<out>.svg and <out>.png).

    python3 examples/python/llama_bible.py                      # 400 steps each (a few minutes)
    python3 examples/python/llama_bible.py --steps 2000 --recipes fp32 mxfp8 nvfp4
"""
import argparse

import torch
import torch.nn.functional as F
import transformers

from common import Progress, use_cores

import fp8lab
import fp8lab.torch as ft  # fp8lab


def stream(verses):
    """The verses as one byte stream, a newline after each."""
    return torch.frombuffer(bytearray("\n".join(verses).encode("utf-8")), dtype=torch.uint8).long()


def blocks(data, n, length, gen):
    """n random blocks of length + 1 bytes: the inputs and, one byte on, the targets."""
    starts = torch.randint(0, data.numel() - length - 1, (n,), generator=gen)
    b = torch.stack([data[s:s + length + 1] for s in starts.tolist()])
    return b[:, :-1], b[:, 1:]


def llama(a):
    torch.manual_seed(a.seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=a.width, intermediate_size=4 * a.width, num_hidden_layers=a.layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=a.length))


def train(recipe, a, train_data, dev_data):
    """Trains one model; returns its loss curve [(step, training loss)] and validation loss."""
    model = llama(a)
    program = ft.quantized(model, recipe, seed=a.seed)  # fp8lab
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    gen = torch.Generator().manual_seed(a.seed)
    curve, bar = [], Progress(a.steps)
    for step in range(1, a.steps + 1):
        x, y = blocks(train_data, a.batch, a.length, gen)
        with program:  # fp8lab: every product inside runs quantized, forward and backward
            loss = F.cross_entropy(model(input_ids=x).logits.reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        curve.append((step, loss.item()))
        bar.update(step, f"{recipe} loss {loss.item():.3f}")
    model.eval()
    with torch.no_grad(), program:
        x, y = blocks(dev_data, 64, a.length, torch.Generator().manual_seed(12345))
        dev = F.cross_entropy(model(input_ids=x).logits.reshape(-1, 256), y.reshape(-1)).item()
    state = ft.quant_state(model)
    assert not state.unquantized, state.unquantized  # fp8lab: every product was quantized
    return curve, dev, len(state.layers)


def smooth(curve, k=20):
    """A running mean over the last k steps."""
    out, total = [], 0.0
    for i, (_, v) in enumerate(curve):
        total += v - (curve[i - k][1] if i >= k else 0.0)
        out.append(total / min(i + 1, k))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=["fp32", "transformer-mixed", "nvfp4"],
                   help="recipes to train with (presets, lines or .toml files)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--data", default="data/bible-en-es", help="where the corpus is built on first use")
    p.add_argument("--out", default="llama-bible-loss", help="the plot's file name, without .svg/.png")
    a = p.parse_args()
    use_cores(a.threads)
    train_data = stream(fp8lab.bible_verses("train", dir=a.data))
    dev_data = stream(fp8lab.bible_verses("dev", dir=a.data))
    curves = {}
    for recipe in a.recipes:
        curve, dev, layers = train(recipe, a, train_data, dev_data)
        curves[recipe] = ([s for s, _ in curve], smooth(curve))
        print(f"{recipe}: validation loss {dev:.3f} nats/byte ({layers} quantized layers)")
    fp8lab.plot_lines(a.out, curves, title="transformers Llama on the King James Bible",
                      xlabel="step", ylabel="training loss (nats per byte, mean of 20 steps)")
    print(f"wrote {a.out}.svg and {a.out}.png")


if __name__ == "__main__":
    main()
