"""OPSD and the OPD loss family through `distill run`, preflight first, compared side by side."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from e2e.test_run import _distill, _only_run, _overrides

pytestmark = pytest.mark.integration


def _train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/loss" in r]


def test_opsd_run_end_to_end(tmp_path: Path, tiny_zoo) -> None:
    ws = tmp_path / "ws"
    overrides = [o for o in _overrides(tiny_zoo, 2, 0) if not o.startswith("teacher.name=")]
    proc = _distill(["run", "--domain", "rlve", "--method", "opsd", *overrides], ws)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "preflight:" in proc.stdout and "self-score" in proc.stdout
    run_dir = _only_run(ws)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["method"] == "opsd"
    assert summary["teacher"] == summary["student"] == str(tiny_zoo.student)
    rows = _train_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(row["train/loss"]) and math.isfinite(row["kl/reverse_kl_mean"])
        # The privileged prompt changes the teacher's view of the same tokens: the KL is not zero.
        assert abs(row["kl/reverse_kl_mean"]) > 1e-4


def test_preflight_only_trains_nothing(tmp_path: Path, tiny_zoo) -> None:
    ws = tmp_path / "ws"
    proc = _distill(
        ["run", "--preflight", "--domain", "rlve", "--method", "opd", *_overrides(tiny_zoo, 2, 0)], ws
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "preflight passed" in proc.stdout and "chat template" in proc.stdout
    assert not (ws / "runs").exists() or not any((ws / "runs").iterdir())


def test_each_loss_variant_trains_without_nan_and_compares(tmp_path: Path, tiny_zoo) -> None:
    ws = tmp_path / "ws"
    variants = ["k3", "forward_kl_topk", "jsd"]
    for loss in variants:
        proc = _distill(
            [
                "run",
                "--domain",
                "rlve",
                "--method",
                "opd",
                *_overrides(tiny_zoo, 2, 0),
                f"method.loss={loss}",
                "method.top_k=8",
                "eval.eval_teacher=false",
                f"tracking.run_name={loss}",
            ],
            ws,
        )
        assert proc.returncode == 0, (loss, proc.stderr[-3000:])
    runs = sorted(p for p in (ws / "runs").iterdir() if p.is_dir())
    assert len(runs) == len(variants)
    for run_dir in runs:
        rows = _train_rows(run_dir)
        assert len(rows) == 2 and all(math.isfinite(r["train/loss"]) for r in rows)
    topk = [r for run_dir in runs for r in _train_rows(run_dir) if "kl/topk_overlap" in r]
    assert topk and all(0.0 <= r["kl/topk_overlap"] <= 1.0 for r in topk)
    proc = _distill(["compare", *[p.name for p in runs], "--format", "csv"], ws)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for loss in variants:
        assert f"opd/{loss}" in proc.stdout
