"""What a run loads before its first step (prepare.py): each teacher once, where it scores, on the
device placement gives it, at the call sites themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny_runs import two_teachers_config

from distill import prepare
from distill.engines.hf import HFEngine, load_tokenizer
from distill.engines.placement import Machine, PlacementError
from distill.engines.worker import WorkerEngine
from distill.settings import get_settings

pytestmark = pytest.mark.integration


def test_async_teachers_are_loaded_once_each_in_its_own_worker(tiny_zoo: Any) -> None:
    """rollout.async_teacher: each hf teacher's engine is its worker process (the weights there and
    nowhere else), one worker a teacher; without it, each teacher is loaded in this process."""
    config = two_teachers_config(tiny_zoo, "rollout.async_teacher=true", "threads=1")
    teachers = prepare.load_teachers(config, get_settings())
    try:
        assert all(isinstance(engine, WorkerEngine) for engine in teachers.values())
        assert prepare.worker_slots(config) == {"rlve": (0, 2), "dapo": (1, 2)}
        assert teachers["rlve"] is not teachers["dapo"]
        assert teachers["rlve"].describe()["path"] == str(tiny_zoo.teacher)
        assert teachers["dapo"].describe()["class"] == "LlamaForCausalLM"
        assert all(engine.alive for engine in teachers.values())  # type: ignore[attr-defined]
    finally:
        for engine in teachers.values():
            engine.close()  # type: ignore[attr-defined]
    # Two domains naming one teacher share one worker.
    shared = two_teachers_config(
        tiny_zoo, "rollout.async_teacher=true", f"teachers.dapo.name={tiny_zoo.teacher}"
    )
    assert prepare.worker_slots(shared) == {"rlve": (0, 1), "dapo": (0, 1)}
    plain = prepare.load_teachers(two_teachers_config(tiny_zoo), get_settings())
    assert all(isinstance(engine, HFEngine) for engine in plain.values())
    assert prepare.worker_slots(two_teachers_config(tiny_zoo)) == {}


class Loaded(HFEngine):
    """What the call sites are asked to load, and where (the decision under test); the model
    itself is not loaded (the tokenizer is: the chat template is applied to it)."""

    def __init__(self, path: str, *args: Any, device: str = "cpu", **kwargs: Any) -> None:
        self.path, self.device = path, device
        self.tokenizer = load_tokenizer(path)


def test_load_engine_puts_each_teacher_worker_on_a_spare_gpu_and_the_rest_on_the_trainers(
    tiny_zoo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node of three GPUs, one trainer process: the student on cuda:0, each teacher's worker on
    a spare GPU of its own (cuda:1, cuda:2), and `model_devices` (the check before the run
    exists, and the start-up note) says the same; synchronous teachers on the trainer's GPU."""
    monkeypatch.setattr(prepare, "this_machine", lambda: Machine(gpus=3))
    monkeypatch.setattr(prepare, "WorkerEngine", Loaded)
    monkeypatch.setattr(prepare.HFEngine, "load", classmethod(lambda cls, path, *a, **k: Loaded(path, **k)))
    config = two_teachers_config(tiny_zoo, "rollout.async_teacher=true")
    teachers = prepare.load_teachers(config, get_settings())
    assert {part: engine.device for part, engine in teachers.items()} == {"rlve": "cuda:1", "dapo": "cuda:2"}  # type: ignore[attr-defined]
    assert prepare.model_devices(config) == {
        "student.device": "cuda:0",
        "teachers.rlve.device": "cuda:1",
        "teachers.dapo.device": "cuda:2",
    }
    assert prepare.load_student(config, get_settings()).device == "cuda:0"  # type: ignore[attr-defined]
    synchronous = prepare.load_teachers(two_teachers_config(tiny_zoo), get_settings())
    assert {engine.device for engine in synchronous.values()} == {"cuda:0"}  # type: ignore[attr-defined]
    # Two spare GPUs for two workers of each of two trainer processes: refused before the run.
    monkeypatch.setattr(prepare, "this_machine", lambda: Machine(gpus=4, local_world_size=2))
    with pytest.raises(PlacementError, match="teachers.rlve.device: 2 teacher workers for each of 2"):
        prepare.model_devices(config)


def test_evaluate_model_loads_the_model_on_the_trainers_gpu(
    tiny_zoo: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from distill.evals import standalone

    asked: list[str] = []

    def load(cls: Any, path: str, *args: Any, device: str = "cpu", **kwargs: Any) -> Any:
        asked.append(device)
        raise RuntimeError("loaded")  # the decision is all this test reads

    monkeypatch.setattr(standalone, "this_machine", lambda: Machine(gpus=2))
    monkeypatch.setattr(standalone.HFEngine, "load", classmethod(load))
    request = standalone.EvalRequest(model=str(tiny_zoo.teacher), items=2, domain_fields={"eval_size": 2})
    with pytest.raises(RuntimeError, match="loaded"):
        standalone.evaluate_model(request, str(tiny_zoo.teacher), get_settings(), say=lambda _: None)
    assert asked == ["cuda:0"]
