"""`distill run` end to end in a subprocess: run directory, MLflow store, resume, failure marking."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .mlflow_level import assert_level, assert_level_to

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
        "preflight.json",
        "summary.json",
        "metrics.jsonl",
        "samples",
        "eval",
        "diagnose",
    } <= artifacts
    assert_level(client, run_dir)
    preflight = json.loads((run_dir / "preflight.json").read_text())
    assert {c["ok"] for c in preflight["checks"].values()} == {True} and "self_score" in preflight["checks"]
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


def _start(
    tiny_zoo: Any, ws: Path, name: str, steps: int, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    args = [
        "run",
        "--domain",
        "rlve",
        "--method",
        "opd",
        *_overrides(tiny_zoo, steps, 2),
        f"tracking.run_name={name}",
    ]
    return subprocess.Popen(
        [sys.executable, "-m", "distill", *args, *extra],
        env=_env(ws),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        # A test run from a background job inherits SIGINT ignored; the Ctrl-C test needs it live.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _train_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["step"] for line in lines if "train/loss" in line and line.endswith("}")]


def _wait_until(proc: subprocess.Popen[bytes], ready: Any, what: str) -> None:
    deadline = time.time() + 300
    while not ready():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # a tiny step takes ~0.1 s: a coarse poll lets a short run run out


def test_killed_run_resumes_from_last_checkpoint(tmp_path: Path, tiny_zoo) -> None:
    """SIGKILL at a random step after the first checkpoint; a second writer is refused while it
    lives; `runs --repair` brings MLflow level; `--resume` ends with MLflow == metrics.jsonl."""
    ws, run_dir = tmp_path / "ws", tmp_path / "ws" / "runs" / "killed"
    kill_after = random.randint(2, 9)
    print(f"killing after step {kill_after}")  # shown with a failure, to re-run the same case
    proc = _start(tiny_zoo, ws, "killed", 12, ("eval.every_steps=4",))
    _wait_until(proc, lambda: (run_dir / "checkpoints" / "step-2").exists(), "the first checkpoint")
    _wait_until(proc, lambda: max(_train_steps(run_dir), default=0) >= kill_after, f"step {kill_after}")
    # Stopped, the writer still lives (and holds the lock) but cannot run out its 12 steps while
    # the refused resume (a whole process start) is checked.
    os.kill(proc.pid, signal.SIGSTOP)
    refused = _distill(["run", "--resume", "killed"], ws)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]
    assert f"is being written by pid {proc.pid}" in refused.stderr
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "RUNNING"  # SIGKILL leaves no chance to write anything
    assert json.loads(_distill(["runs", "--json"], ws).stdout)[0]["status"] == "DIED"
    old_id = summary["mlflow_run_id"]
    # Before any repair: the last checkpoint brought MLflow level with metrics.jsonl up to it.
    last = max(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step-*"))
    assert_level_to(_client(ws), run_dir, last)

    repaired = _distill(["runs", "--repair"], ws)
    assert repaired.returncode == 0 and "killed: DIED" in repaired.stdout, repaired.stdout + repaired.stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "DIED"
    client = _client(ws)
    old = client.get_run(old_id)
    assert old.info.status == "KILLED" and old.data.tags["distill.status"] == "DIED"
    assert_level(client, run_dir)  # what the tracker still held at SIGKILL was sent
    artifacts = {a.path for a in client.list_artifacts(old_id)}
    assert {
        "config.yaml",
        "manifest.json",
        "preflight.json",
        "metrics.jsonl",
        "samples",
        "summary.json",
    } <= artifacts

    resumed = _distill(["run", "--resume", "killed"], ws)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming killed from step-" in resumed.stdout and f"replaces {old_id}" in resumed.stdout
    assert max(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step-*")) == 12
    state = json.loads((run_dir / "checkpoints" / "step-12" / "trainer_state.json").read_text())
    assert state["global_step"] == 12
    # Every step exactly once, in the file and in MLflow: re-trained steps replace the lost ones.
    assert _train_steps(run_dir) == list(range(1, 13))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and "student_after" in summary and "error" not in summary
    assert summary["mlflow_run_id"] != old_id
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "killed"
    stored = assert_level(client, run_dir)
    assert sorted({s for k, s, _ in stored if k == "eval/rlve/accuracy"}) == [0, 4, 8, 12]
    assert client.get_run(old_id).info.lifecycle_stage == "deleted"
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [run.info.run_id]
    # The manifest keeps the command that started the run; the resume is recorded beside it.
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "tracking.run_name=killed" in manifest["argv"] and "--resume" not in manifest["argv"]
    assert [r["argv"][-2:] for r in manifest["resumes"]] == [["--resume", "killed"]]
    assert manifest["mlflow_run_id"] == summary["mlflow_run_id"]

    # Resuming the FINISHED run again is a one-line no-op.
    before = (run_dir / "metrics.jsonl").read_text(), (run_dir / "summary.json").read_text()
    again = _distill(["run", "--resume", "killed"], ws)
    assert again.returncode == 0 and len(again.stdout.strip().splitlines()) == 1
    assert "FINISHED; nothing to resume" in again.stdout
    assert ((run_dir / "metrics.jsonl").read_text(), (run_dir / "summary.json").read_text()) == before


def test_interrupted_run_is_killed_with_its_record_and_resumes_exactly(tmp_path: Path, tiny_zoo) -> None:
    """Ctrl-C in the middle of a step: KILLED, every file in MLflow, MLflow == metrics.jsonl; the
    resumed run shows each step once in both."""
    ws, run_dir = tmp_path / "ws", tmp_path / "ws" / "runs" / "interrupted"
    proc = _start(tiny_zoo, ws, "interrupted", 8)
    _wait_until(proc, lambda: max(_train_steps(run_dir), default=0) >= 3, "step 3")
    time.sleep(0.05)  # into step 4 (a tiny step takes ~0.1 s)
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    assert proc.returncode == 130
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "KILLED" and "KeyboardInterrupt" in summary["error"]
    client = _client(ws)
    killed = client.get_run(summary["mlflow_run_id"])
    assert killed.info.status == "KILLED"
    artifacts = {a.path for a in client.list_artifacts(killed.info.run_id)}
    assert {
        "config.yaml",
        "manifest.json",
        "preflight.json",
        "metrics.jsonl",
        "summary.json",
        "error.log",
        "samples",
        "eval",
        "diagnose",
    } <= artifacts
    assert_level(client, run_dir)

    resumed = _distill(["run", "--resume", "interrupted"], ws)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _train_steps(run_dir) == list(range(1, 9))
    assert_level(client, run_dir)
    assert client.get_run(killed.info.run_id).info.lifecycle_stage == "deleted"


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
    """A run whose preflight refuses to start: FAILED in both places, its files in MLflow, and
    `distill diagnose` reports the failed check once, by its own rule."""
    ws = tmp_path / "ws"
    overrides = [*_overrides(tiny_zoo, 2, 0), "student.enable_thinking=true", "teacher.enable_thinking=false"]
    proc = _distill(["run", "--domain", "rlve", "--method", "opd", *overrides], ws)
    assert proc.returncode == 1
    assert "error: run failed: PreflightError: thinking mode differs" in proc.stderr
    run_dir = _only_run(ws)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FAILED" and "thinking mode differs" in summary["error"]
    assert "Traceback" in (run_dir / "error.log").read_text()
    preflight = json.loads((run_dir / "preflight.json").read_text())
    assert preflight["checks"]["thinking_mode"]["ok"] is False
    assert "enable_thinking" in preflight["checks"]["thinking_mode"]["detail"]
    client = _client(ws)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FAILED" and "thinking mode differs" in run.data.tags["distill.error"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "preflight.json", "summary.json", "error.log", "diagnose"} <= artifacts

    diagnosed = _distill(["diagnose", run_dir.name, "--format", "json", "--no-plots", "--no-mlflow"], ws)
    [report] = json.loads(diagnosed.stdout)["runs"]
    # The failed check is reported once, by its own rule (with both settings), not again as
    # a generic `preflight_failed`.
    names = [f["name"] for f in report["findings"]]
    assert names.count("thinking_mismatch") == 1 and "preflight_failed" not in names
    [mismatch] = [f for f in report["findings"] if f["name"] == "thinking_mismatch"]
    assert mismatch["severity"] == "error"
    assert {e["value"] for e in mismatch["evidence"]} == {"True", "False"}


def test_resume_refuses_models_that_changed_since_the_run_started(tmp_path: Path, tiny_zoo) -> None:
    """The manifest pins the starting weights; a resume against an edited student folder would
    train the rest of the run from other weights, so it stops and names what differs."""
    import shutil

    from safetensors.torch import load_file, save_file

    student = tmp_path / "student"
    shutil.copytree(tiny_zoo.student, student)
    ws = tmp_path / "ws"
    args = ["run", "--domain", "rlve", "--method", "opd", *_overrides(tiny_zoo, 2, 1)]
    args = [a if not a.startswith("student.name=") else f"student.name={student}" for a in args]
    done = _distill([*args, "tracking.run_name=pinned", "eval.items=2"], ws)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = ws / "runs" / "pinned"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["start"]["student"]["weights"]
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "FAILED"}))  # resumable again

    weights = load_file(student / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 1.0
    save_file(weights, student / "model.safetensors", metadata={"format": "pt"})
    refused = _distill(["run", "--resume", "pinned"], ws)
    assert refused.returncode != 0
    assert "models changed since it started" in refused.stderr and "student" in refused.stderr, refused.stderr
    # The record of what the run started from is untouched by the refused attempt.
    assert json.loads((run_dir / "manifest.json").read_text())["start"] == manifest["start"]


def test_resume_from_the_last_steps_checkpoint_trains_nothing_more(tmp_path: Path, tiny_zoo) -> None:
    """A run stopped in its final eval resumes from the checkpoint of its last step: the final
    eval on those weights, and no extra step (transformers' Trainer, resumed at max_steps, ran
    one step before it checked the limit: "step 9/8" once in the test suite)."""
    from types import SimpleNamespace

    from distill.engines.hf import HFEngine
    from distill.methods.context import train_or_take_final

    ws, run_dir = tmp_path / "ws", tmp_path / "ws" / "runs" / "ended"
    done = _distill(
        [
            "run",
            "--domain",
            "rlve",
            "--method",
            "opd",
            *_overrides(tiny_zoo, 2, 1),
            "tracking.run_name=ended",
        ],
        ws,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # As a kill in the final eval leaves it.
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "KILLED"}))
    resumed = _distill(["run", "--resume", "ended"], ws)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "all 2 steps are in step-2; the final eval follows" in resumed.stdout + resumed.stderr
    assert _train_steps(run_dir) == [1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == ["step-1", "step-2"]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "FINISHED"
    assert_level(_client(ws), run_dir)

    # The weights the final eval gets are the checkpoint's, not the start's; an earlier checkpoint trains.
    config = SimpleNamespace(
        optim=SimpleNamespace(max_steps=2), student=SimpleNamespace(precision="fp32", enable_thinking=None)
    )
    trained: list[int] = []
    for step in (2, 1):
        start = HFEngine.load(str(tiny_zoo.student))
        ctx = SimpleNamespace(
            config=config, resume_from=run_dir / "checkpoints" / f"step-{step}", student=start, say=print
        )
        out = train_or_take_final(ctx, lambda c, s=step: trained.append(s))  # type: ignore[arg-type]
        if step == 2:
            final = HFEngine.load(str(run_dir / "checkpoints" / "step-2"))
            assert _same_weights(out, final) and out is not start
            assert not _same_weights(start, final)  # training moved them: the line above means something
        else:
            assert out is start
    assert trained == [1]


def _same_weights(a: Any, b: Any) -> bool:
    import torch

    pairs = zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True)
    return all(torch.equal(x, y) for x, y in pairs)
