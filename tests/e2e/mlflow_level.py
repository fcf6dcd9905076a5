"""What the e2e tests check of every run: its MLflow run holds exactly what metrics.jsonl holds,
each (key, step, value) once and nothing else."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from distill.tracking.mlflow import mlflow_metric_name

Point = tuple[str, int, Any]


def _value(v: Any) -> Any:
    v = float(v)  # StepLog writes non-finite figures as "nan" / "inf": the same number
    return "nan" if math.isnan(v) else v


def file_points(run_dir: Path) -> Counter[Point]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # MLflow refuses '@' and '+' in names: `avg@1` is stored as `avg_at_1` (tracking/mlflow.py).
    return Counter(
        (mlflow_metric_name(k), r["step"], _value(v)) for r in rows for k, v in r.items() if k != "step"
    )


def mlflow_points(client: Any, run_id: str) -> Counter[Point]:
    keys = client.get_run(run_id).data.metrics
    return Counter((k, m.step, _value(m.value)) for k in keys for m in client.get_metric_history(run_id, k))


def assert_level(client: Any, run_dir: Path) -> Counter[Point]:
    """MLflow run (the one summary.json names) == metrics.jsonl, every point once; returns them."""
    run_id = json.loads((run_dir / "summary.json").read_text())["mlflow_run_id"]
    expected, stored = file_points(run_dir), mlflow_points(client, run_id)
    assert max(expected.values()) == 1, [p for p, n in expected.items() if n > 1][:5]
    assert stored == expected, {"missing": list(expected - stored)[:5], "extra": list(stored - expected)[:5]}
    return stored


def assert_level_to(client: Any, run_dir: Path, step: int) -> None:
    """Every point of metrics.jsonl up to `step` (the last checkpoint) is in the MLflow run, once:
    what a checkpoint guarantees even when the run is SIGKILLed right after it."""
    run_id = json.loads((run_dir / "summary.json").read_text())["mlflow_run_id"]
    expected = Counter({p: n for p, n in file_points(run_dir).items() if p[1] <= step})
    stored = Counter({p: n for p, n in mlflow_points(client, run_id).items() if p[1] <= step})
    assert stored == expected, {"missing": list(expected - stored)[:5], "extra": list(stored - expected)[:5]}
