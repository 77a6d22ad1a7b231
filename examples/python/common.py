"""What the examples share: Fashion-MNIST from Debian's dataset-fashion-mnist package (no
torchvision), a progress bar, and the process set-up an application chooses."""
import gzip
import os
import pathlib
import sys
import time

import numpy as np
import torch

FASHION_MNIST = pathlib.Path("/usr/share/datasets/fashion-mnist")


def read_idx(path: pathlib.Path) -> np.ndarray:
    """An IDX file (gzip-compressed) as a NumPy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 8:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape}, file holds {body.size} values")
    return body.reshape(shape)


def fashion_mnist(root: pathlib.Path = FASHION_MNIST):
    """(train images, train labels, test images, test labels): images float32 [N, 1, 28, 28]
    normalised by the training set's mean and deviation, labels int64."""
    if not root.exists():
        sys.exit(f"{root} is missing: install Debian's dataset-fashion-mnist package")
    parts = [read_idx(root / f"{s}-{k}-idx{d}-ubyte.gz") for s in ("train", "t10k") for k, d in (("images", 3),
                                                                                               ("labels", 1))]
    xtr, ytr, xte, yte = parts
    xtr = torch.from_numpy(xtr.astype(np.float32) / 255).unsqueeze(1)
    xte = torch.from_numpy(xte.astype(np.float32) / 255).unsqueeze(1)
    mean, sd = xtr.mean().item(), xtr.std().item()
    return (xtr - mean) / sd, torch.from_numpy(ytr.astype(np.int64)), (xte - mean) / sd, torch.from_numpy(
        yte.astype(np.int64))


def use_cores(threads: int = 0) -> int:
    """The application's choice of libtorch threads (0: every core this process may use)."""
    n = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(n)
    return n


class Progress:
    """A one-line progress bar on stderr with rate and time left."""

    def __init__(self, total: int, unit: str = "step"):
        self.total, self.unit, self.t0, self.last = total, unit, time.monotonic(), 0.0

    def update(self, done: int, note: str = "") -> None:
        now = time.monotonic()
        if now - self.last < 0.2 and done < self.total:
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        left = (self.total - done) / rate if rate > 0 else float("inf")
        width = 30
        fill = int(width * done / self.total)
        sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} {rate:.1f} {self.unit}/s "
                         f"ETA {left:4.0f}s {note}\033[K")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()
