"""Runs trained from Python recorded in fp8lab's results store (the SQLite file that
`fp8lab train` writes), so that `fp8lab runs` lists them beside the C++ trainer's.

    with fp8lab.torch.RunRecorder("results.db", "my-cnn", model=model, scaler=scaler, seed=0) as run:
        for step ...:
            run.log(step, loss=loss.item())
        run.finish(accuracy, "test_accuracy")
"""
from __future__ import annotations

import json
import time
from typing import Optional

from .. import _core
from ._convert import quant_state


class RunRecorder:
    """One run in the store: begun when made, closed by finish() or when the `with` block
    ends (status finished; failed on an exception, stopped on KeyboardInterrupt)."""

    def __init__(self, db: str, name: str, *, model=None, scaler=None, seed: int = 0, config: Optional[dict] = None,
                 kind: str = "python"):
        self.store = _core.Store(str(db))
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
        for k, v in metrics.items():
            self.store.log_metric(self.id, int(step), k, float(v))
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
