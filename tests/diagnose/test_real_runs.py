"""Diagnose on REAL short runs (tiny zoo models, `distill run` in a subprocess, 3 steps, one thread).

- teacher-SFT with `rollout.max_new_tokens` far below the teacher's chain: every trajectory is cut
  at the budget, so teacher/truncation_rate and teacher/ce_target_share come out ~1.
- OPD in bf16 at lr 1e-6 (the reference's bf16 runs): the weights after 3 steps are (nearly)
  bit-identical to the start, while the same run in fp32 at lr 1e-4 moves them; diagnose names
  the bf16 resolution as the cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from distill.diagnose import Severity, diagnose, load_run

pytestmark = pytest.mark.integration


def _env(workspace: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DISTILL_WORKSPACE": str(workspace),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


def _overrides(tiny_zoo, name: str) -> list[str]:
    d = tiny_zoo.domain
    return [
        f"student.name={tiny_zoo.student}",
        f"teacher.name={tiny_zoo.teacher}",
        f"domain.train_size={d.train_size}",
        f"domain.eval_size={d.eval_size}",
        "optim.max_steps=3",
        "checkpoint.every_steps=0",
        "rollout.prompts_per_step=4",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=24",
        "eval.items=4",
        "eval.max_new_tokens=24",
        "eval.eval_teacher=false",
        "optim.batch_size=8",
        "threads=1",
        f"tracking.run_name={name}",
    ]


def _distill(args: list[str], workspace: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distill", *args],
        env=_env(workspace),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory, tiny_zoo) -> Path:
    ws = tmp_path_factory.mktemp("diagnose-real")
    runs = {
        # The rollout budget is the teacher's trajectory budget in teacher-SFT.
        "sft-cut": ["--method", "sft", "rollout.max_new_tokens=4", "method.keep_verified_only=false"],
        "opd-bf16": ["--method", "opd", "student.precision=bf16", "optim.lr=1e-6"],
        "opd-fp32": ["--method", "opd", "student.precision=fp32", "optim.lr=1e-4"],
    }
    for name, extra in runs.items():
        method, rest = extra[:2], extra[2:]
        proc = _distill(["run", "--domain", "rlve", *method, *_overrides(tiny_zoo, name), *rest], ws)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return ws


def _changed_fraction(start: Path, checkpoint: Path) -> float:
    a, b = load_file(start / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    changed = sum(int((a[k].to(b[k].dtype) != b[k]).sum()) for k in b)
    return changed / sum(b[k].numel() for k in b)


def test_sft_teacher_cut_at_budget(real_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTILL_WORKSPACE", str(real_runs))
    rec = load_run("sft-cut")
    assert rec.get("teacher/truncation_rate").mean() >= 0.9
    assert rec.get("teacher/ce_target_share").mean() >= 0.9
    [f] = [f for f in diagnose(rec) if f.name == "teacher_truncation"]
    assert f.severity is Severity.ERROR
    assert [x.override for x in f.fixes] == ["rollout.max_new_tokens=8"]  # 2 x the 4-token targets


def test_bf16_updates_round_away_fp32_moves(
    real_runs: Path, tiny_zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTILL_WORKSPACE", str(real_runs))
    bf16 = _changed_fraction(tiny_zoo.student, real_runs / "runs" / "opd-bf16" / "checkpoints" / "step-3")
    fp32 = _changed_fraction(tiny_zoo.student, real_runs / "runs" / "opd-fp32" / "checkpoints" / "step-3")
    assert bf16 < 0.05, bf16  # (nearly) bit-identical to the start, compared in bf16
    assert fp32 > 0.5, fp32
    ckpt = load_file(real_runs / "runs" / "opd-bf16" / "checkpoints" / "step-3" / "model.safetensors")
    assert next(iter(ckpt.values())).dtype == torch.bfloat16

    [f] = [f for f in diagnose(load_run("opd-bf16")) if f.name == "precision"]
    assert f.severity is Severity.ERROR and f.title.startswith("updates round to zero in bf16")
    measured = next(e for e in f.evidence if e.source.startswith("checkpoints/step-3 vs start weights"))
    assert f"{1 - bf16:.1%}" in f.title and "compared in bf16" in measured.note
    assert f.fixes[0].override == "student.precision=fp32"
    assert [f for f in diagnose(load_run("opd-fp32")) if f.name == "precision"] == []


def test_cli_on_a_real_run_logs_to_its_mlflow_run(real_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from distill.cli.app import app

    monkeypatch.setenv("DISTILL_WORKSPACE", str(real_runs))
    result = CliRunner().invoke(app, ["diagnose", "opd-bf16", "--format", "json"])
    assert result.exit_code == 2, result.output[-2000:]
    [run] = json.loads(result.stdout)["runs"]
    assert run["findings"][0]["severity"] == "error"
    assert "precision" in [f["name"] for f in run["findings"]]
    summary = json.loads((real_runs / "runs" / "opd-bf16" / "summary.json").read_text())
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    listed = {a.path for a in client.list_artifacts(summary["mlflow_run_id"], "diagnose")}
    assert "diagnose/report.json" in listed and "diagnose/loss.png" in listed
    assert client.get_run(summary["mlflow_run_id"]).info.status == "FINISHED"
