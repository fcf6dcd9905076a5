"""The manifest records where each model ran: `models.<role>.device` from the engines themselves,
`server` for a served teacher, and the teacher's worker process where one scored."""

from __future__ import annotations

from typing import Any

from distill.archive.manifest import build_manifest, model_record
from distill.config import RunConfig
from distill.engines.hf import HFEngine


class Served:
    """What a served teacher's engine describes (engines/server.py): no device of its own."""

    def describe(self) -> dict[str, Any]:
        return {"engine": "server", "url": "http://127.0.0.1:8000", "path": "teacher"}


def test_a_manifest_names_each_models_device(tiny_zoo: Any) -> None:
    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    config = RunConfig.model_validate(
        {"student": {"name": str(tiny_zoo.student)}, "teacher": {"name": str(tiny_zoo.teacher)}}
    )
    manifest = build_manifest(
        config, ["distill", "run"], "run-id", student, teacher, teacher_worker_device="cpu"
    )
    models = manifest["models"]
    assert models["student"]["device"] == "cpu" and "worker_device" not in models["student"]
    assert models["teacher"]["device"] == "cpu" and models["teacher"]["worker_device"] == "cpu"
    # An engine whose weights were moved reports where they are now.
    teacher.model.to("meta")
    assert model_record(teacher)["device"] == "meta"


def test_a_served_teacher_runs_on_its_server() -> None:
    record = model_record(Served())  # type: ignore[arg-type]
    assert record["device"] == "server" and record["url"] == "http://127.0.0.1:8000"
