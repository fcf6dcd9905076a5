"""`distill run` end to end in a subprocess: run directory, MLflow store, resume, failure marking."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _env(workspace: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DISTILL_WORKSPACE=str(workspace),
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
    )
    return env


def _overrides(tiny_zoo, steps: int, every: int) -> list[str]:
    d = tiny_zoo.domain
    return [
        f"student.name={tiny_zoo.student}",
        f"teacher.name={tiny_zoo.teacher}",
        f"domain.train_size={d.train_size}",
        f"domain.eval_size={d.eval_size}",
        f"optim.max_steps={steps}",
        f"checkpoint.every_steps={every}",
        "rollout.prompts_per_step=4",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=24",
        "eval.items=8",
        "eval.max_new_tokens=24",
        "optim.batch_size=8",
        "threads=1",
    ]


def _distill(args: list[str], workspace: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distill", *args],
        env=_env(workspace),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _only_run(workspace: Path) -> Path:
    runs = [p for p in (workspace / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _client(workspace: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{(workspace / 'mlflow.db').resolve()}")


def test_opd_run_writes_run_dir_and_mlflow(tmp_path: Path, tiny_zoo) -> None:
    ws = tmp_path / "ws"
    proc = _distill(["run", "--domain", "rlve", "--method", "opd", *_overrides(tiny_zoo, 4, 2)], ws)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = _only_run(ws)
    assert "student  accuracy" in proc.stdout and "mlflow ui --backend-store-uri" in proc.stdout

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED"
    assert (summary["domain"], summary["method"]) == ("rlve", "opd")
    for key in ("student_before", "student_after", "teacher_score"):
        assert 0.0 <= summary[key]["accuracy"] <= 1.0
        assert summary[key]["items"] == 8
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["config"]["optim"]["max_steps"] == 4
    assert {"torch", "transformers", "trl", "mlflow"} <= set(manifest["packages"])
    assert manifest["hardware"]["cpu_count"] >= 1 and "optim.max_steps=4" in manifest["argv"]
    assert manifest["mlflow_run_id"] == summary["mlflow_run_id"]

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4]
    for row in train_rows:
        for key in (
            "train/grad_norm",
            "train/lr",
            "perf/step_time_s",
            "perf/tokens_per_s",
            "perf/gen_time_s",
            "perf/teacher_time_s",
            "student/completion_tokens_mean",
            "student/completion_tokens_max",
            "student/truncation_rate",
            "kl/reverse_kl_mean",
            "kl/reverse_kl_std",
            "kl/advantage_mean",
        ):
            assert key in row, key
    assert (run_dir / "samples" / "step-1.jsonl").exists()
    sample = json.loads((run_dir / "samples" / "step-1.jsonl").read_text().splitlines()[0])
    assert {"prompt", "student", "student_tokens", "truncated"} <= set(sample)
    for step in (2, 4):
        ckpt = run_dir / "checkpoints" / f"step-{step}"
        assert (ckpt / "model.safetensors").exists() and (ckpt / "trainer_state.json").exists()
        assert (ckpt / "optimizer.pt").exists()
    assert not list((run_dir / "checkpoints").glob("checkpoint-*"))

    client = _client(ws)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["optim.max_steps"] == "4" and run.data.params["method.name"] == "opd"
    tags = run.data.tags
    assert tags["domain"] == "rlve" and tags["method"] == "opd"
    assert tags["student"] == str(tiny_zoo.student) and tags["teacher"] == str(tiny_zoo.teacher)
    assert "git.sha" in tags and "git.dirty" in tags and tags["distill.version"]
    per_step = [k for k in run.data.metrics if len(client.get_metric_history(run.info.run_id, k)) >= 4]
    assert len(per_step) >= 10, per_step
    assert "eval/rlve/accuracy" in run.data.metrics and "eval/rlve/avg_at_1" in run.data.metrics
    history = client.get_metric_history(run.info.run_id, "eval/rlve/accuracy")
    assert sorted(m.step for m in history) == [0, 4]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {
        "config.yaml",
        "manifest.json",
        "summary.json",
        "metrics.jsonl",
        "samples",
        "eval",
        "diagnose",
    } <= artifacts
    # The run ends with its own diagnosis: report and plots in the run dir, counts in summary.json.
    report = json.loads((run_dir / "diagnose" / "report.json").read_text())
    assert report["run_id"] == run_dir.name and report["status"] == "FINISHED"
    assert (run_dir / "diagnose" / "loss.png").exists()
    assert set(summary["diagnose"]["counts"]) == {"error", "warning", "info"}
    assert "diagnose" in proc.stdout

    listed = _distill(["runs", "--json"], ws)
    assert listed.returncode == 0
    [entry] = json.loads(listed.stdout)
    assert (
        entry["run_id"] == run_dir.name
        and entry["student_after"]["accuracy"] == summary["student_after"]["accuracy"]
    )

    # `distill eval` of a checkpoint is logged as a nested run of its training run.
    evaluated = _distill(
        [
            "eval",
            "--model",
            str(run_dir / "checkpoints" / "step-4"),
            "--items",
            "8",
            "-n",
            "2",
            "--max-new-tokens",
            "24",
        ],
        ws,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "pass@2" in evaluated.stdout and "nested under" in evaluated.stdout
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{run.info.run_id}'"
    )
    assert len(children) == 1
    child = children[0].data
    assert 0.0 <= child.metrics["eval/rlve/pass_at_2"] <= 1.0 and child.params["k"] == "2"


def test_killed_run_resumes_from_last_checkpoint(tmp_path: Path, tiny_zoo) -> None:
    ws = tmp_path / "ws"
    args = [
        sys.executable,
        "-m",
        "distill",
        "run",
        "--domain",
        "rlve",
        "--method",
        "opd",
        *_overrides(tiny_zoo, 12, 2),
    ]
    proc = subprocess.Popen(args, env=_env(ws), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    ckpt_dir = None
    while time.time() < deadline:
        runs = list((ws / "runs").glob("*")) if (ws / "runs").exists() else []
        if runs and (runs[0] / "checkpoints" / "step-4").exists():
            ckpt_dir = runs[0]
            break
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        time.sleep(0.2)
    assert ckpt_dir is not None, "no checkpoint appeared"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run_dir = _only_run(ws)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "RUNNING"  # SIGKILL leaves no chance to write anything
    listed = json.loads(_distill(["runs", "--json"], ws).stdout)
    assert listed[0]["status"] == "DIED"

    resumed = _distill(["run", "--resume", run_dir.name], ws)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    last = max(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step-*"))
    assert last == 12
    assert "resuming" in resumed.stdout and "from step-" in resumed.stdout
    state = json.loads((run_dir / "checkpoints" / "step-12" / "trainer_state.json").read_text())
    assert state["global_step"] == 12
    steps = [
        json.loads(line)["step"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "train/loss" in line
    ]
    assert steps == list(range(1, 13))  # every step exactly once: re-trained steps replace the lost ones
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and "student_after" in summary
    run = _client(ws).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert len(_client(ws).search_runs([run.info.experiment_id])) == 1


def test_sft_run_trains_on_teacher_trajectories(tmp_path: Path, tiny_zoo) -> None:
    ws = tmp_path / "ws"
    proc = _distill(
        [
            "run",
            "--domain",
            "rlve",
            "--method",
            "sft",
            *_overrides(tiny_zoo, 3, 0),
            "method.keep_verified_only=false",
        ],
        ws,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = _only_run(ws)
    trajectories = [
        json.loads(line)
        for line in (run_dir / "data" / "teacher_trajectories.jsonl").read_text().splitlines()
    ]
    assert len(trajectories) >= 3 * 8 and all("completion" in t and "correct" in t for t in trajectories)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    budget = next(r for r in rows if "teacher/truncation_rate" in r)
    assert 0.0 <= budget["teacher/truncation_rate"] <= 1.0 and budget["teacher/ce_target_tokens_mean"] > 0
    assert [r["step"] for r in rows if "train/ce_loss" in r] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "step-3" / "model.safetensors").exists()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "FINISHED"


def test_failing_run_is_marked_failed(tmp_path: Path, tiny_zoo) -> None:
    ws = tmp_path / "ws"
    overrides = [o for o in _overrides(tiny_zoo, 2, 0) if not o.startswith("student.name")]
    proc = _distill(["run", *overrides, f"student.name={tmp_path / 'no-such-model'}"], ws)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: run failed")
    run_dir = _only_run(ws)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FAILED" and "no-such-model" in summary["error"]
    assert "Traceback" in (run_dir / "error.log").read_text()
    run = _client(ws).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FAILED" and "no-such-model" in run.data.tags["distill.error"]
