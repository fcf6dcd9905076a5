"""MlflowTracker against a real sqlite store under tmp_path."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from distill.config import flatten
from distill.tracking.mlflow import MlflowTracker, find_runs, git_tags, mlflow_ui_command, open_tracker


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, Path]:
    # Nested folder: open_tracker must create the DB's parent itself.
    return f"sqlite:///{tmp_path / 'ws' / 'mlflow.db'}", tmp_path / "ws" / "mlartifacts"


def client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_params_tags_metrics_round_trip(store: tuple[str, Path]) -> None:
    uri, artifacts = store
    tracker = open_tracker(uri, "exp", artifacts, run_name="r1", tags={"distill.method": "kd"})
    config = {"optim": {"lr": 1e-4, "betas": [0.9, 0.95]}, "seed": 7, "note": None, "long": "x" * 7000}
    tracker.log_params(flatten(config))
    tracker.set_tags({"stage": "train"})
    for step in (0, 10, 20):
        tracker.log_metrics({"loss": 1.0 / (step + 1), "skipped": None}, step=step)  # type: ignore[dict-item]

    c = client(uri)
    assert c.get_metric_history(tracker.run_id, "loss") == []  # still buffered
    tracker.flush()
    history = c.get_metric_history(tracker.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (10, 1 / 11), (20, 1 / 21)]
    assert c.get_metric_history(tracker.run_id, "skipped") == []

    run = c.get_run(tracker.run_id)
    assert run.info.run_name == "r1"
    assert run.data.params["optim.lr"] == "0.0001"
    assert run.data.params["optim.betas"] == "[0.9, 0.95]"
    assert run.data.params["seed"] == "7"
    assert run.data.params["note"] == "None"
    assert run.data.params["long"] == "x" * 6000
    assert run.data.tags["stage"] == "train"
    assert run.data.tags["distill.method"] == "kd"
    tracker.finish()
    assert c.get_run(tracker.run_id).info.status == "FINISHED"


def test_many_metrics_auto_flush_and_chunking(store: tuple[str, Path]) -> None:
    uri, artifacts = store
    tracker = open_tracker(uri, "exp", artifacts)
    keys = [f"m{i}" for i in range(12)]
    for step in range(100):
        tracker.log_metrics({k: float(step) for k in keys}, step=step)
    # 1200 entries queued: past 500 the writer thread sends them, off this thread, before flush().
    deadline = time.time() + 10
    while not client(uri).get_metric_history(tracker.run_id, "m0") and time.time() < deadline:
        time.sleep(0.1)
    assert len(client(uri).get_metric_history(tracker.run_id, "m0")) > 0
    tracker.flush()
    c = client(uri)
    for key in keys:
        history = c.get_metric_history(tracker.run_id, key)
        assert sorted(m.step for m in history) == list(range(100))
    tracker.finish()


def test_artifacts_land_under_experiment_location(store: tuple[str, Path], tmp_path: Path) -> None:
    uri, artifacts = store
    tracker = open_tracker(uri, "exp", artifacts)
    report = tmp_path / "report.txt"
    report.write_text("hello")
    model_dir = tmp_path / "model"
    (model_dir / "sub").mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    (model_dir / "sub" / "w.bin").write_bytes(b"\0\1")
    tracker.log_artifact(report)
    tracker.log_artifact(model_dir, artifact_path="model")
    tracker.finish()

    c = client(uri)
    experiment = c.get_experiment_by_name("exp")
    assert experiment.artifact_location == (artifacts / "exp").resolve().as_uri()
    run_root = Path(c.get_run(tracker.run_id).info.artifact_uri.removeprefix("file://"))
    assert run_root.is_relative_to(artifacts.resolve())
    assert (run_root / "report.txt").read_text() == "hello"
    assert (run_root / "model" / "sub" / "w.bin").read_bytes() == b"\0\1"
    names = {a.path for a in c.list_artifacts(tracker.run_id)}
    assert names == {"report.txt", "model"}


def test_finish_failed_records_error(store: tuple[str, Path]) -> None:
    uri, artifacts = store
    tracker = open_tracker(uri, "exp", artifacts)
    tracker.log_metrics({"loss": 1.0}, step=1)
    tracker.finish("FAILED", error="boom")
    run = client(uri).get_run(tracker.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["distill.error"] == "boom"
    assert run.data.metrics["loss"] == 1.0  # finish flushed the buffer
    with pytest.raises(ValueError):
        tracker.finish("DONE")


def test_resume_reuses_run(store: tuple[str, Path]) -> None:
    uri, artifacts = store
    params = {"lr": 0.1, "layers": [1, 2]}
    first = open_tracker(uri, "exp", artifacts, run_name="r")
    first.log_params(params)
    first.log_metrics({"loss": 2.0}, step=1)
    first.finish("KILLED")
    assert client(uri).get_run(first.run_id).info.status == "KILLED"

    second = open_tracker(uri, "exp", artifacts, resume_run_id=first.run_id)
    assert second.run_id == first.run_id
    assert client(uri).get_run(second.run_id).info.status == "RUNNING"
    second.log_params(params)  # identical values: no error
    second.log_params({**params, "new": 1})  # partly known, partly new
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException):
        second.log_params({"lr": 0.2})  # changing a param must still fail
    second.log_metrics({"loss": 1.0}, step=2)
    second.finish()

    c = client(uri)
    assert [(m.step, m.value) for m in c.get_metric_history(first.run_id, "loss")] == [(1, 2.0), (2, 1.0)]
    assert c.get_run(first.run_id).data.params["new"] == "1"
    assert len(find_runs(uri, "exp")) == 1


def test_nested_run_and_find_runs(store: tuple[str, Path]) -> None:
    uri, artifacts = store
    parent = open_tracker(uri, "sweep", artifacts, run_name="parent")
    child = open_tracker(uri, "sweep", artifacts, run_name="child", parent_run_id=parent.run_id)
    child.log_params({"lr": 0.5})
    child.log_metrics({"acc": 0.5}, step=0)
    child.log_metrics({"acc": 0.75}, step=1)
    child.finish()
    parent.finish()

    runs = find_runs(uri, "sweep")
    assert {r["run_name"] for r in runs} == {"parent", "child"}
    found = next(r for r in runs if r["run_name"] == "child")
    assert found["tags"]["mlflow.parentRunId"] == parent.run_id
    assert found["params"] == {"lr": "0.5"}
    assert found["metrics"] == {"acc": 0.75}
    assert found["status"] == "FINISHED"
    assert [r["run_id"] for r in find_runs(uri, filter_string="params.lr = '0.5'")] == [child.run_id]
    assert find_runs(uri, "missing") == []


def _open_and_log(uri: str, artifact_root: str, index: int) -> str:
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    tracker = MlflowTracker.open_tracker(uri, "race", Path(artifact_root), run_name=f"p{index}")
    tracker.log_metrics({"x": float(index)}, step=0)
    tracker.finish()
    return tracker.run_id


def test_concurrent_first_open(store: tuple[str, Path]) -> None:
    uri, artifacts = store
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        run_ids = pool.starmap(_open_and_log, [(uri, str(artifacts), i) for i in range(3)])
    assert len(set(run_ids)) == 3
    c = client(uri)
    for index, run_id in enumerate(run_ids):
        run = c.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert run.data.metrics["x"] == float(index)
    assert len(find_runs(uri, "race")) == 3


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def test_git_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("a")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "init")

    tags = git_tags(repo)
    assert re.fullmatch(r"[0-9a-f]{40}", tags["git.sha"])
    assert tags["git.dirty"] == "false"
    assert tags["mlflow.source.git.commit"] == tags["git.sha"]

    (repo / "untracked.txt").write_text("b")
    assert git_tags(repo)["git.dirty"] == "true"

    outside = tmp_path / "plain"
    outside.mkdir()
    assert git_tags(outside) == {"git.sha": "unknown", "git.dirty": "unknown"}


def test_git_tags_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git binary on PATH
    assert git_tags(tmp_path) == {"git.sha": "unknown", "git.dirty": "unknown"}


def test_ui_command(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = mlflow_ui_command(uri, tmp_path / "mlartifacts")
    assert command.startswith(f"mlflow ui --backend-store-uri {uri} ")
    assert f"--default-artifact-root {(tmp_path / 'mlartifacts').as_uri()}" in command
    assert "--default-artifact-root" not in mlflow_ui_command(uri, None)
    # A tracking server is opened in a browser: its own URL, never `mlflow ui` on an http URI.
    for server in ("http://127.0.0.1:5000", "https://mlflow.example.org/"):
        assert mlflow_ui_command(server, tmp_path / "mlartifacts") == server


def test_sync_levels_the_store_and_never_waits_on_one_that_is_down(
    store: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from mlflow.tracking import MlflowClient

    uri, artifacts = store
    tracker = open_tracker(uri, "exp", artifacts)
    tracker.log_metrics({"loss": 1.0}, step=1)
    tracker.set_tags({"checkpoint.last": "step-1"})
    assert tracker.sync(30.0) is True
    assert [m.step for m in client(uri).get_metric_history(tracker.run_id, "loss")] == [1]
    assert client(uri).get_run(tracker.run_id).data.tags["checkpoint.last"] == "step-1"
    tracker.finish()

    # A server that is not there: the writer fails once, and sync returns at once from then on.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    down = f"http://127.0.0.1:{port}"
    tracker = MlflowTracker(MlflowClient(tracking_uri=down), "0" * 32, down)
    tracker.log_metrics({"loss": 1.0}, step=1)
    start = time.monotonic()
    assert tracker.sync(60.0) is False
    assert time.monotonic() - start < 30  # the first failed write, not the 60 s bound
    start = time.monotonic()
    assert tracker.sync(60.0) is False and time.monotonic() - start < 0.5
