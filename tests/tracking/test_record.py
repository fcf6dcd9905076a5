"""A run's MLflow record equals its run directory: a resume's fresh run replaces the old one, a
run that died is repaired. Real sqlite MLflow store; the run directories are written by hand
(what a killed run leaves), so each case is exact and takes a second."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from distill.config import dump_config, resolve_config
from distill.settings import Settings
from distill.tracking.mlflow import open_tracker
from distill.tracking.record import open_run_tracker
from distill.tracking.rundir import RunDir


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _value(v: Any) -> Any:
    v = float(v)
    return "nan" if math.isnan(v) else v


def file_points(run: RunDir) -> Counter[tuple[str, int, Any]]:
    rows = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    return Counter(
        (k.replace("@", "_at_"), r["step"], _value(v)) for r in rows for k, v in r.items() if k != "step"
    )


def mlflow_points(uri: str, run_id: str) -> Counter[tuple[str, int, Any]]:
    client = _client(uri)
    keys = client.get_run(run_id).data.metrics
    return Counter(
        (key, m.step, _value(m.value)) for key in keys for m in client.get_metric_history(run_id, key)
    )


def _rows(steps: range) -> list[dict[str, Any]]:
    rows = [{"step": 0, "eval/rlve/avg@1": 0.25, "eval/rlve/accuracy": 0.25}]
    rows += [
        {"step": s, "train/loss": 1.0 / s, "kl/reverse_kl_std": "nan" if s == 2 else 0.1 * s} for s in steps
    ]
    return rows


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the module (creating one costs seconds); each test has its own
    workspace and experiment in it."""
    from distill.tracking.mlflow import client_for

    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    client_for(uri)
    return uri


@pytest.fixture
def made(tmp_path: Path, store: str) -> tuple[Settings, RunDir, dict[str, Any]]:
    """A run as a process left it: config, summary (RUNNING, its MLflow run), metrics steps 0-7,
    the checkpoint of step 4; the MLflow run holds every point, as the tracker had sent them."""
    settings = Settings(workspace=tmp_path / "ws", tracking_uri=store)
    experiment = tmp_path.name
    config = resolve_config("rlve", "opd", overrides=[f"tracking.experiment={experiment}"])
    run = RunDir.create(settings.runs_dir, "r1")
    dump_config(config, run.config)
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in _rows(range(1, 8))))
    run.checkpoint(4).mkdir(parents=True)
    uri = settings.resolved_tracking_uri
    parent = open_tracker(uri, experiment, settings.artifact_root, run_name="sweep")
    old = open_tracker(uri, experiment, settings.artifact_root, run_name="r1", parent_run_id=parent.run_id)
    old.set_tags({"mlflow.note.content": "the user's note", "distill.error": "an earlier attempt's"})
    old.log_points(run.metric_points())
    old.finish("KILLED")
    child = open_tracker(uri, experiment, settings.artifact_root, run_name="eval", parent_run_id=old.run_id)
    summary = {
        "tracking_uri": uri,
        "mlflow_run_id": old.run_id,
        "status": "RUNNING",
        "run_dir": str(run.path),
    }
    run.write_summary(summary)
    run.write_manifest({"mlflow_run_id": old.run_id, "argv": ["distill", "run"]})
    return settings, run, {"parent": parent.run_id, "old": old.run_id, "child": child.run_id}


def test_a_resume_replays_the_trimmed_file_into_a_fresh_run_that_replaces_the_old(made: Any) -> None:
    settings, run, ids = made
    uri = settings.resolved_tracking_uri
    run.trim_metrics(4, 7)  # what `--resume` does first: steps 5-7 are trained again
    summary = run.read_summary()
    said: list[str] = []
    tracker = open_run_tracker(
        run.read_config(), settings, run, summary, run.checkpoint(4), resuming=True, say=said.append
    )
    new = tracker.run_id
    assert new != ids["old"] and summary["mlflow_run_id"] == new == run.read_summary()["mlflow_run_id"]
    assert run.read_manifest()["mlflow_run_id"] == new
    assert "mlflow_superseded" not in run.read_summary()
    # Exactly the trimmed file: the old run's points of steps 5-7 are not carried over.
    assert mlflow_points(uri, new) == file_points(run) and max(s for _, s, _ in file_points(run)) == 4
    client = _client(uri)
    assert client.get_run(ids["old"]).info.lifecycle_stage == "deleted"
    fresh = client.get_run(new)
    assert (
        fresh.info.run_name == "r1"
        and fresh.info.experiment_id == client.get_run(ids["parent"]).info.experiment_id
    )
    tags = fresh.data.tags
    assert tags["mlflow.parentRunId"] == ids["parent"] and tags["mlflow.note.content"] == "the user's note"
    assert "distill.error" not in tags and tags["checkpoint.last"] == str(run.checkpoint(4))
    assert tags["method"] == "opd" and fresh.data.params["method.name"] == "opd"
    assert client.get_run(ids["child"]).data.tags["mlflow.parentRunId"] == new  # nested evals follow
    assert {a.path for a in client.list_artifacts(new)} >= {"config.yaml", "metrics.jsonl", "summary.json"}
    assert any(ids["old"] in line for line in said)
    tracker.finish("FINISHED")

    # A second resume (say the first died right after its commit point) replaces this one in turn.
    summary = run.read_summary()
    again = open_run_tracker(run.read_config(), settings, run, summary, run.checkpoint(4), True, said.append)
    assert client.get_run(new).info.lifecycle_stage == "deleted"
    assert mlflow_points(uri, again.run_id) == file_points(run)
    active = client.search_runs([fresh.info.experiment_id])
    assert sorted(r.info.run_name for r in active) == ["eval", "r1", "sweep"]
    again.finish("FINISHED")


def test_a_resume_ends_the_runs_it_replaces_before_deleting_them(made: Any) -> None:
    """A SIGKILLed attempt's MLflow run is still RUNNING with no end time: the resume ends it
    KILLED, now, then deletes it. An attempt that had ended (here FAILED, a while ago) keeps how
    and when it ended."""
    import time

    from mlflow.entities import Metric

    settings, run, ids = made
    uri = settings.resolved_tracking_uri
    client = _client(uri)
    failed_at = 1_700_000_000_000
    client.set_terminated(ids["old"], status="FAILED", end_time=failed_at)
    killed = client.create_run(client.get_run(ids["old"]).info.experiment_id, run_name="r1").info.run_id
    client.log_batch(killed, metrics=[Metric("train/loss", 0.5, 0, 5)])
    summary = run.read_summary()
    summary.update(mlflow_run_id=killed, mlflow_superseded=[ids["old"]])
    run.write_summary(summary)
    assert client.get_run(killed).info.status == "RUNNING" and client.get_run(killed).info.end_time is None

    run.trim_metrics(4, 7)
    before = int(time.time() * 1000)
    tracker = open_run_tracker(
        run.read_config(), settings, run, summary, run.checkpoint(4), True, lambda _: None
    )
    after = int(time.time() * 1000)
    gone = client.get_run(killed)
    assert gone.info.lifecycle_stage == "deleted" and gone.info.status == "KILLED"
    assert gone.info.end_time is not None and before <= gone.info.end_time <= after
    assert gone.data.tags["distill.replaced_by"] == tracker.run_id
    earlier = client.get_run(ids["old"])
    assert earlier.info.lifecycle_stage == "deleted"
    assert earlier.info.status == "FAILED" and earlier.info.end_time == failed_at
    assert "distill.replaced_by" not in client.get_run(tracker.run_id).data.tags
    tracker.finish("FINISHED")


def test_repair_marks_a_killed_run_died_and_sends_the_points_mlflow_never_got(made: Any) -> None:
    from distill.runner import repair_runs

    settings, run, ids = made
    uri = settings.resolved_tracking_uri
    # SIGKILL: the last steps were in metrics.jsonl but still in the tracker's buffer.
    with run.metrics.open("a") as fh:
        for row in _rows(range(8, 11))[1:]:
            fh.write(json.dumps(row) + "\n")
    summary = run.read_summary()
    summary["pid"] = _dead_pid()
    run.write_summary(summary)
    assert mlflow_points(uri, ids["old"]) != file_points(run)

    said: list[str] = []
    assert repair_runs(settings, None, said.append) == 0
    summary = run.read_summary()
    assert summary["status"] == "DIED" and "--resume r1" in summary["error"] and summary["finished"]
    assert mlflow_points(uri, ids["old"]) == file_points(run)
    mlflow_run = _client(uri).get_run(ids["old"])
    assert mlflow_run.info.status == "KILLED" and mlflow_run.data.tags["distill.status"] == "DIED"
    assert mlflow_run.data.tags["checkpoint.last"] == str(run.checkpoint(4))
    artifacts = {a.path for a in _client(uri).list_artifacts(ids["old"])}
    assert {"config.yaml", "metrics.jsonl", "summary.json", "manifest.json", "diagnose"} <= artifacts
    assert any("+6 points" in line for line in said), said  # 3 steps x 2 keys

    # Done: nothing left to repair, and repairing the run again adds nothing.
    said.clear()
    assert repair_runs(settings, None, said.append) == 0 and said == [said[0]] and "nothing" in said[0]
    assert repair_runs(settings, "r1", said.append) == 0
    assert "+0 points" in said[-1] and mlflow_points(uri, ids["old"]) == file_points(run)


def test_repair_replaces_an_mlflow_run_that_holds_points_the_file_lost(made: Any) -> None:
    from distill.runner import repair_runs

    settings, run, ids = made
    uri = settings.resolved_tracking_uri
    # A resume trimmed metrics.jsonl to its checkpoint, then failed before it reached the store.
    run.trim_metrics(4, 7)
    summary = run.read_summary()
    summary.update(status="FAILED", error="MlflowException: store unreachable")
    run.write_summary(summary)
    said: list[str] = []
    assert repair_runs(settings, "r1", said.append) == 0
    new = run.read_summary()["mlflow_run_id"]
    assert new != ids["old"] and _client(uri).get_run(ids["old"]).info.lifecycle_stage == "deleted"
    assert mlflow_points(uri, new) == file_points(run)
    fresh = _client(uri).get_run(new)
    assert fresh.info.status == "FAILED" and fresh.data.tags["distill.status"] == "FAILED"
    assert fresh.data.tags["mlflow.parentRunId"] == ids["parent"]
    assert any(f"replaces {ids['old']}" in line for line in said), said


def test_repair_leaves_a_run_that_is_still_written_alone(made: Any) -> None:
    from distill.runner import repair_runs
    from distill.tracking.lock import RunLock

    settings, run, _ = made
    with RunLock.acquire(run):  # this process writes the run
        said: list[str] = []
        assert repair_runs(settings, "r1", said.append) == 0
    assert said == ["r1: still running; nothing to repair"]
    assert run.read_summary()["status"] == "RUNNING"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert proc.pid != os.getpid()
    return proc.pid
