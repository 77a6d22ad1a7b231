#!/usr/bin/env python3
"""A transformers Llama training step (AdamW) in float32 against the same step run inside
fp8lab.torch.quantized with each recipe, interleaved round by round in one process: the
ratio to float32 is what quantized simulation costs for a model people train.

    PYTHONPATH=build/python .venv/bin/python bench/bench_llama.py [--recipes transformer-mixed nvfp4]
    PYTHONPATH=build/python .venv/bin/python bench/bench_llama.py --compile   # every variant torch.compile'd
    PYTHONPATH=build/python .venv/bin/python bench/bench_llama.py --path module --compile

--path dispatch (the default) quantizes every product of the program (fp8lab.torch.quantized);
--path module converts the model with quantize_model, which quantizes its Linear layers and
leaves the attention products of F.scaled_dot_product_attention float32. Compiled, the module
path's products are custom operators inside one graph; the dispatch path's run eagerly
between compiled pieces (docs/python.md, "torch.compile").
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
import transformers

import fp8lab.torch as ft
from interleaved import interleaved


class Step:
    def __init__(self, a, recipe):
        torch.manual_seed(0)
        self.model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=256, hidden_size=a.width, intermediate_size=4 * a.width, num_hidden_layers=a.layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=a.length))
        self.context = None
        if recipe is not None and a.path == "dispatch":
            self.context = ft.quantized(self.model, recipe)
        elif recipe is not None:
            self.model = ft.quantize_model(self.model, recipe)
        self.forward = torch.compile(self.model) if a.compile else self.model
        self.x = torch.randint(0, 256, (a.batch, a.length))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def step(self):
        t0 = time.perf_counter()
        self.opt.zero_grad()
        if self.context is None:
            logits = self.forward(input_ids=self.x).logits
        else:
            with self.context:
                logits = self.forward(input_ids=self.x).logits
        F.cross_entropy(logits[:, :-1].reshape(-1, 256), self.x[:, 1:].reshape(-1)).backward()
        self.opt.step()
        return (time.perf_counter() - t0) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=["fp32", "transformer-mixed", "mxfp8", "nvfp4"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=3, help="steps per variant and round")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile each variant's model (inductor)")
    p.add_argument("--path", choices=["dispatch", "module"], default="dispatch",
                   help="fp8lab.torch.quantized (every product) or quantize_model (Linear layers)")
    a = p.parse_args()
    torch.set_num_threads(a.threads or len(os.sched_getaffinity(0)))
    if a.compile:  # each variant's model compiles the same functions: room for all of them
        torch._dynamo.config.recompile_limit = 64
    variants = {"float32": Step(a, None), **{r: Step(a, r) for r in a.recipes}}
    times = interleaved(variants, a.rounds, a.steps)
    print(f"transformers Llama{' (torch.compile)' if a.compile else ''}, {a.path} path, width {a.width}, "
          f"{a.layers} layers, "
          f"batch {a.batch} x {a.length} tokens, "
          f"{torch.get_num_threads()} threads; median over {a.rounds} rounds of the best of {a.steps} steps")
    for k, v in times.items():
        ratio = [x / y for x, y in zip(v, times["float32"])]
        print(f"  {k:18s} {statistics.median(v):8.1f} ms/step  / float32 {statistics.median(ratio):.2f} "
              f"(min {min(ratio):.2f}, max {max(ratio):.2f})")


if __name__ == "__main__":
    main()
