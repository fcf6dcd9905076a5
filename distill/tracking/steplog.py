"""The per-step record of a run: `metrics.jsonl` and the tracker, side by side; rollout samples."""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from distill.tracking.base import Tracker
    from distill.tracking.rundir import RunDir


class StepRecord(Protocol):
    """What a method writes its step figures and samples to (a `StepLog`, or a silent one on
    ranks > 0 of a multi-process run)."""

    tracker: Tracker
    # Figures a method computes during a step, merged into the trainer's log line.
    pending: dict[str, float]
    # Seconds spent writing records since they were last taken (`perf/tracking_s`).
    spent: float

    def add(self, metrics: dict[str, float]) -> None: ...

    def write(self, step: int, metrics: dict[str, float]) -> None: ...

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...


class StepLog:
    """Per-step metrics to `metrics.jsonl` and the tracker; rollout samples to `samples/`."""

    def __init__(self, run: RunDir, tracker: Tracker) -> None:
        self.run = run
        self.tracker = tracker
        self.pending: dict[str, float] = {}
        self.spent = 0.0

    def add(self, metrics: dict[str, float]) -> None:
        self.pending.update(metrics)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        start = time.perf_counter()
        clean = {k: float(v) for k, v in metrics.items() if v is not None and not isinstance(v, str)}
        with self.run.metrics.open("a") as fh:
            row = {"step": step, **{k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}
            fh.write(json.dumps(row) + "\n")
        self.tracker.log_metrics(clean, step=step)
        self.spent += time.perf_counter() - start

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        start = time.perf_counter()
        self.run.samples.mkdir(exist_ok=True)
        with self.run.samples_file(step).open("w") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        self.spent += time.perf_counter() - start


class SilentLog:
    """A rank > 0's step record: keeps the step's figures for the all-rank reduction, writes nothing."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        self.pending: dict[str, float] = {}
        self.spent = 0.0

    def add(self, metrics: dict[str, float]) -> None:
        self.pending.update(metrics)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        pass
