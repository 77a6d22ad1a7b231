"""Loss scaling (docs/spec.md §5) used like torch.cuda.amp.GradScaler:

    scaler = fp8lab.torch.LossScaler("backoff", recipe="resnet32-152")
    scaler.scale(loss).backward()
    scaler.step(optimizer)      # unscales the gradients; skips the step on NaN/Inf (Backoff)
    scaler.update()

The decisions are the C++ trainer's own (nn::LossScaler): static, Backoff and LogMax, with
LogMax aiming at the largest value of the recipe's gradient format.
"""
from __future__ import annotations

import math
import warnings
from typing import List, Optional, Tuple

import torch

from .. import _core
from .._errors import UsageError


class LossScaler:
    """method: 'none', 'static:K' (alpha = 2^K), 'backoff[:init=K,interval=N,factor=F]' or
    'logmax[:c=C,init=K,...]'. recipe: the recipe being trained (LogMax's target)."""

    def __init__(self, method: str = "backoff", recipe=None):
        r = None if recipe is None else (recipe if isinstance(recipe, _core.Recipe) else _core.Recipe(str(recipe)))
        self._core = _core.LossScalerCore(method, r)
        if r is not None and _core.backoff_blind_to_overflow(method, r):
            warnings.warn("Backoff loss scaling only sees overflow as NaN/Inf, but this recipe's gradient "
                          "quantizer saturates: the scale will only grow. Use overflow nan "
                          "(e.g. gx=1.5.2:33/rne/nan) or LogMax.", stacklevel=2)
        self.method = self._core.describe()
        self.trace: List[Tuple[int, int, bool]] = []  # (step, log2 scale, skipped) per step
        self._unscaled = None  # the decision of this iteration, once the gradients are unscaled
        self._iteration = 0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """loss times the current scale alpha."""
        return loss * self._core.scale()

    def get_scale(self) -> float:
        return self._core.scale()

    @staticmethod
    def _grads(optimizer) -> List[torch.Tensor]:
        return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]

    def unscale_(self, optimizer) -> None:
        """Divides the gradients by alpha in place and decides this step (call it before
        clipping gradients; step() calls it otherwise)."""
        if self._unscaled is not None:
            raise UsageError("unscale_() was already called since the last update()")
        scale = self._core.scale()
        self._unscaled = self._core.update(self._grads(optimizer))
        self.trace.append((self._iteration, int(round(math.log2(scale))), self._unscaled["skipped"]))

    def step(self, optimizer, *args, **kwargs) -> Optional[object]:
        """optimizer.step() unless the gradients overflowed and the method skips the step."""
        if self._unscaled is None:
            self.unscale_(optimizer)
        if self._unscaled["skipped"]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self) -> None:
        """Ends the iteration (the next scale was set when the gradients were unscaled)."""
        if self._unscaled is None:
            raise UsageError("update() without step() or unscale_() in this iteration")
        self._unscaled = None
        self._iteration += 1

    @property
    def skipped_steps(self) -> int:
        return self._core.skipped_steps()

    @property
    def last(self) -> Optional[dict]:
        """This iteration's decision: scale, overflow, skipped, log2_max_grad."""
        return self._unscaled

    def state_dict(self) -> dict:
        return {"method": self.method, "state": self._core.state(), "iteration": self._iteration}

    def load_state_dict(self, d: dict) -> None:
        if d.get("method") != self.method:
            raise ValueError(f"loss scaler state of {d.get('method')!r}, this scaler is {self.method!r}")
        self._core.set_state(d["state"])
        self._iteration = int(d["iteration"])
