"""The manifest records where each model ran, read from the engines themselves through the
runner's own `_manifest`: `server` for a served teacher, the worker's device for a teacher that
scored in its worker process, each domain's teacher its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from distill import runner
from distill.archive.manifest import model_record
from distill.config import resolve_config
from distill.engines.hf import HFEngine
from distill.engines.server import ServerEngine
from distill.engines.worker import WorkerEngine
from distill.settings import get_settings
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir

pytestmark = pytest.mark.integration


def _job(tmp_path: Path, overrides: list[str]) -> runner.Job:
    config = resolve_config("rlve,dapo", "opd", None, overrides)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    return runner.Job(config, get_settings(), run, NullTracker(), {}, None, ["distill", "run"], print)


def test_each_teachers_device_is_its_own_engines(tiny_zoo: Any, tmp_path: Path) -> None:
    """rlve's teacher scores in its worker process, dapo's behind a server: the manifest says so of
    each (a device recomputed from the first domain's config would give dapo's a worker too)."""
    job = _job(
        tmp_path,
        [
            f"student.name={tiny_zoo.student}",
            f"teachers.rlve.name={tiny_zoo.teacher}",
            f"teachers.dapo.name={tiny_zoo.teacher}",
            "teachers.dapo.engine=server",
            "teachers.dapo.url=http://127.0.0.1:8000",
            "rollout.async_teacher=true",
        ],
    )
    student = HFEngine.load(str(tiny_zoo.student))
    worker = WorkerEngine(str(tiny_zoo.teacher), threads=1)
    served = ServerEngine("http://127.0.0.1:8000", student.tokenizer, "teacher", path=str(tiny_zoo.teacher))
    try:
        manifest = runner._manifest(job, student, worker, {"rlve": worker, "dapo": served})
    finally:
        worker.close()
    models = manifest["models"]
    assert models["student"]["device"] == "cpu" and "worker_device" not in models["student"]
    for role in ("teacher", "teacher@rlve"):
        assert models[role]["device"] == models[role]["worker_device"] == "cpu", role
    assert models["teacher@dapo"]["device"] == "server" and "worker_device" not in models["teacher@dapo"]


def test_an_in_process_teacher_is_recorded_where_its_weights_are(tiny_zoo: Any, tmp_path: Path) -> None:
    job = _job(
        tmp_path,
        [f"student.name={tiny_zoo.student}", f"teachers.rlve.name={tiny_zoo.teacher}"]
        + [f"teachers.dapo.name={tiny_zoo.teacher_llama}"],
    )
    student = HFEngine.load(str(tiny_zoo.student))
    rlve, dapo = HFEngine.load(str(tiny_zoo.teacher)), HFEngine.load(str(tiny_zoo.teacher_llama))
    dapo.model.to("meta")  # stands for another device than rlve's teacher's
    models = runner._manifest(job, student, rlve, {"rlve": rlve, "dapo": dapo})["models"]
    assert models["teacher@rlve"]["device"] == "cpu" and models["teacher@dapo"]["device"] == "meta"
    assert all("worker_device" not in record for record in models.values())


def test_a_served_teacher_runs_on_its_server(tiny_zoo: Any) -> None:
    tokenizer = HFEngine.load(str(tiny_zoo.teacher)).tokenizer
    record = model_record(ServerEngine("http://127.0.0.1:8000", tokenizer, "teacher"))
    assert record["device"] == "server" and record["url"] == "http://127.0.0.1:8000"
