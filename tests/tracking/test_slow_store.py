"""A run whose tracking store is slow: steps do not wait for it, and no metric point is lost.

The store is the real sqlite MLflow store; the delay is injected into the client's `log_batch`
for metric writes (what a remote tracking server under load does to every write)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

DELAY_S = 0.4


def test_slow_store_costs_no_step_time_and_loses_no_point(
    tiny_zoo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from distill.config import resolve_config
    from distill.runner import execute
    from distill.settings import Settings

    slow: list[float] = []
    original = MlflowClient.log_batch

    def slow_log_batch(self: Any, run_id: str, metrics: Any = (), *args: Any, **kwargs: Any) -> Any:
        if metrics:
            slow.append(DELAY_S)
            time.sleep(DELAY_S)
        return original(self, run_id, metrics, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", slow_log_batch)
    d = tiny_zoo.domain
    config = resolve_config(
        "rlve",
        "opd",
        overrides=[
            f"student.name={tiny_zoo.student}",
            f"teacher.name={tiny_zoo.teacher}",
            f"domain.train_size={d.train_size}",
            f"domain.eval_size={d.eval_size}",
            "optim.max_steps=12",
            "checkpoint.every_steps=4",
            "rollout.prompts_per_step=4",
            "rollout.max_new_tokens=16",
            "eval.items=4",
            "eval.max_new_tokens=8",
            "eval.eval_teacher=false",
            "threads=1",
        ],
    )
    summary = execute(config, Settings(workspace=tmp_path / "ws"), argv=["test"], say=lambda _: None)
    assert summary["status"] == "FINISHED"

    rows = [
        json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if "perf/step_time_s" in r]
    assert len(steps) == 12
    step_time = sum(r["perf/step_time_s"] for r in steps)
    tracking = sum(r["perf/tracking_s"] for r in steps)
    # The store was slow enough to matter had a step waited on it...
    assert sum(slow) > 0.02 * step_time
    # ...and the steps spent under 2% of their time on tracking.
    assert tracking <= 0.02 * step_time, (tracking, step_time)

    # Every point of metrics.jsonl is in MLflow, with its step and value; nothing more.
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    expected: dict[str, set[tuple[int, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, float | int):
                expected.setdefault(key.replace("@", "_at_"), set()).add((row["step"], float(value)))
    for key, points in expected.items():
        stored = {(m.step, m.value) for m in client.get_metric_history(summary["mlflow_run_id"], key)}
        assert stored == points, key
    assert client.get_run(summary["mlflow_run_id"]).data.tags["checkpoint.last"].endswith("step-12")
