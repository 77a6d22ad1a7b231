"""Data-parallel training from Python: torch's DistributedDataParallel and FSDP2's fully_shard
over Gloo, two processes on this machine, with quantized models (both paths). Each rank
computes shard r of every step's batch with QuantState.shard = r; the run must equal one
process computing the shards in turn with the same shard numbers, summing their gradients
and dividing by the shard count (docs/python.md, "Data-parallel training"), bit for bit.
"""
import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import fp8lab.torch as ft

WORLD, STEPS = 2, 3
RECIPES = ["a=1.4.3:10,w=1.4.3:14,gx=1.5.2:33/stochastic,gw=1.5.2:31,first=false", "nvfp4"]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 6 * 6, 32)
        self.out = torch.nn.Linear(32, 5)

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        return self.out(torch.relu(self.fc(h)))


def _data():
    g = torch.Generator().manual_seed(21)
    return torch.randn(STEPS, WORLD, 4, 3, 6, 6, generator=g), torch.randint(0, 5, (STEPS, WORLD, 4), generator=g)


def _model(path: str, recipe: str):
    """The model, its quantization (a QuantState) and how to run a forward under it."""
    torch.manual_seed(0)
    net = Net()
    if path == "module":
        net = ft.quantize_model(net, recipe)
        return net, (lambda m, x: m(x))
    program = ft.quantized(net, recipe)

    def run(m, x):
        with program:
            return m(x)
    return net, run


def _worker(rank: int, store: str, out: str, wrapper: str, path: str, recipe: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        net, run = _model(path, recipe)
        st = ft.quant_state(net)
        st.shard = rank  # this rank computes shard `rank` of every step
        if wrapper == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(net)
        else:
            from torch.distributed.fsdp import fully_shard
            fully_shard(net)
            model = net
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        xs, ys = _data()
        for s in range(STEPS):
            opt.zero_grad()
            F.cross_entropy(run(model, xs[s, rank]), ys[s, rank]).backward()
            opt.step()
        params = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                  for k, v in net.named_parameters()}
        counts = st.counts()
        if rank == 0:
            torch.save({"params": params, "counts": counts}, out)
        # torch 2.13's Gloo process group can deadlock when the DDP model's reducer is freed:
        # the reducer, freed holding the GIL, takes the group down and joins its worker
        # threads, one of which was seen (gdb) freeing a collective whose captured thread state
        # holds a Python object, waiting for the GIL. It happened on the dispatch path only
        # (about one run in ten, before this change as after). A barrier lets the workers
        # finish (it waits without the GIL), and the model goes before the group: no hang in
        # 25 runs since (docs/python.md, "Data-parallel training").
        dist.barrier()
        del model, net, opt, run
    finally:
        dist.destroy_process_group()


def _one_process(path: str, recipe: str):
    """The shards in turn on one process: their gradients summed, then divided by their count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        net, run = _model(path, recipe)
        st = ft.quant_state(net)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        xs, ys = _data()
        for s in range(STEPS):
            opt.zero_grad()
            for r in range(WORLD):
                st.step, st.shard = s, r  # every shard runs as step s
                F.cross_entropy(run(net, xs[s, r]), ys[s, r]).backward()
            for p in net.parameters():
                p.grad /= WORLD
            opt.step()
        return {k: v.detach().clone() for k, v in net.named_parameters()}
    finally:
        torch.set_num_threads(threads)


def _spawn(tmp_path: pathlib.Path, wrapper: str, path: str, recipe: str) -> dict:
    out = tmp_path / "rank0.pt"
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(out), wrapper, path, recipe), nprocs=WORLD, join=True)
    return torch.load(out)


@pytest.mark.parametrize("recipe", RECIPES, ids=["mixed-stochastic", "nvfp4"])
@pytest.mark.parametrize("path", ["module", "dispatch"])
def test_ddp_on_two_processes_is_the_one_process_run(tmp_path, path, recipe):
    got = _spawn(tmp_path, "ddp", path, recipe)
    want = _one_process(path, recipe)
    assert got["params"].keys() == want.keys()
    for k, v in want.items():
        assert torch.equal(got["params"][k], v), (k, (got["params"][k] - v).abs().max())
    assert all(c["a"]["total"] > 0 for c in got["counts"].values())  # rank 0 quantized its shard


def test_fsdp2_on_two_processes_is_the_one_process_run(tmp_path):
    pytest.importorskip("torch.distributed.fsdp")
    got = _spawn(tmp_path, "fsdp2", "module", RECIPES[0])
    want = _one_process("module", RECIPES[0])
    for k, v in want.items():
        assert torch.equal(got["params"][k], v), (k, (got["params"][k] - v).abs().max())
