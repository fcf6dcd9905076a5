"""What a method gets from the runner, and the per-step record it writes back."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.domains.base import Domain
    from distill.engines.hf import HFEngine
    from distill.evals.runner import EvalResult
    from distill.tracking.base import Tracker


class StepLog:
    """Per-step metrics to `metrics.jsonl` and the tracker; rollout samples to `samples/`."""

    def __init__(self, run_dir: Path, tracker: Tracker) -> None:
        self.run_dir = run_dir
        self.tracker = tracker
        self.path = run_dir / "metrics.jsonl"
        # Figures a method computes during a step, merged into the trainer's log line.
        self.pending: dict[str, float] = {}

    def add(self, metrics: dict[str, float]) -> None:
        self.pending.update(metrics)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and not isinstance(v, str)}
        with self.path.open("a") as fh:
            row = {"step": step, **{k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}
            fh.write(json.dumps(row) + "\n")
        self.tracker.log_metrics(clean, step=step)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        folder = self.run_dir / "samples"
        folder.mkdir(exist_ok=True)
        with (folder / f"step-{step}.jsonl").open("w") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")


@dataclass
class RunContext:
    config: RunConfig
    run_dir: Path
    domain: Domain
    student: HFEngine
    teacher: HFEngine
    log: StepLog
    # A complete checkpoint folder to continue from (`distill run --resume`).
    resume_from: Path | None = None
    # Called with (step, live student engine) every eval.every_steps; returns the eval result.
    evaluate_student: Any = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"


def last_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete `checkpoints/step-N` (renamed into place only once fully written)."""
    folder = run_dir / "checkpoints"
    if not folder.exists():
        return None
    steps = []
    for child in folder.iterdir():
        if child.is_dir() and child.name.startswith("step-") and child.name[5:].isdigit():
            steps.append((int(child.name[5:]), child))
    return max(steps)[1] if steps else None


def eval_metric_names(benchmark: str, result: EvalResult) -> dict[str, float]:
    return {f"eval/{benchmark}/{k}": v for k, v in result.metrics.items()}
