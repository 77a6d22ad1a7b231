"""Runs trained from Python recorded in fp8lab's results store (the SQLite file that
`fp8lab train` writes), so that `fp8lab runs` lists them beside the C++ trainer's.

    with fp8lab.torch.RunRecorder("results.db", "my-cnn", model=model, scaler=scaler, seed=0) as run:
        for step ...:
            run.log(step, loss=loss.item())
        run.finish(accuracy, "test_accuracy")
"""
from __future__ import annotations

import json
import math
import time
from typing import Optional

from .. import _core
from .._data import _path
from ._convert import quant_state
from ._scaling import LossScaler


def _check_text(what: str, v) -> None:
    """A run's name or kind: non-empty text without control characters (`fp8lab runs` prints
    it on one line, and `report --name` looks it up)."""
    if not isinstance(v, str):
        raise TypeError(f"RunRecorder: {what} must be a str, got {type(v).__name__}")
    if not v or any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise ValueError(f"RunRecorder: {what} {v!r} must be non-empty text without control characters")


class RunRecorder:
    """One run in the store: begun when made, closed by finish() or when the `with` block
    ends (status finished; failed on an exception, stopped on KeyboardInterrupt)."""

    def __init__(self, db: str, name: str, *, model=None, scaler=None, seed: int = 0, config: Optional[dict] = None,
                 kind: str = "python"):
        for what, v in (("name", name), ("kind", kind)):
            _check_text(what, v)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"RunRecorder: seed must be an integer in 0..2^64-1, got {seed!r}")
        if scaler is not None and not isinstance(scaler, LossScaler):
            raise TypeError(f"RunRecorder: scaler must be an fp8lab.torch.LossScaler, got {type(scaler).__name__}")
        self.store = _core.Store(_path(db, "RunRecorder: db"))
        self.model = model
        self.scaler = scaler
        state = quant_state(model) if model is not None else None
        recipe = state.recipe if state is not None else "fp32"
        loss_scale = scaler.method if scaler is not None else "none"
        full = {"source": "python", "name": name, "seed": seed, "quant": {"recipe": recipe, "loss_scale": loss_scale}}
        if state is not None:
            full["quant"].update(compute=state.context.compute, accumulate=state.context.accumulate,
                                 layers=state.quantizers())
        if model is not None:
            full["model"] = type(model).__name__
        if config:
            full["config"] = config
        self.id = self.store.begin_run(name, kind, json.dumps(full, sort_keys=True), recipe, loss_scale, seed)
        self._t0 = time.monotonic()
        self._trace_done = 0
        self._last = None
        self.finished = False

    def log(self, step: int, **metrics: float) -> None:
        """Metrics at a step (e.g. loss=..., test_accuracy=...); the last one logged is the
        run's final metric unless finish() names one."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
            raise ValueError(f"RunRecorder.log: step must be an integer in 0..2^63-1, got {step!r}")
        values = {k: float(v) for k, v in metrics.items()}
        for k, v in values.items():
            if not math.isfinite(v):
                raise ValueError(f"RunRecorder.log: {k} is {v} at step {step}; the store keeps finite values "
                                 "(a run that diverged ends with finish(status='diverged'))")
        for k, v in values.items():
            self.store.log_metric(self.id, step, k, v)
            self._last = (k, float(v))

    def log_stats(self) -> int:
        """Moves the model's statistics records (quantize_model's stats_interval) into the
        store; returns how many."""
        if self.model is None:
            return 0
        rows = quant_state(self.model).context.take_stat_rows()
        if rows:
            self.store.log_stats(self.id, rows)
        return len(rows)

    def _flush_trace(self) -> None:
        if self.scaler is None:
            return
        new = self.scaler.trace[self._trace_done:]
        if new:
            self.store.log_loss_scale(self.id, new)
            self._trace_done += len(new)

    def finish(self, metric: Optional[float] = None, metric_name: str = "", status: str = "finished") -> None:
        if self.finished:
            return
        self.log_stats()
        self._flush_trace()
        if metric is None and self._last is not None:
            metric_name, metric = self._last
        self.store.finish_run(self.id, status, metric, metric_name, time.monotonic() - self._t0)
        self.finished = True

    def __enter__(self) -> "RunRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.finish()
        else:
            self.finish(status="stopped" if issubclass(exc_type, KeyboardInterrupt) else "failed")
        return False
