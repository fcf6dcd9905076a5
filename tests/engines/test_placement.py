"""Placement: which device each model goes to, decided from the config's `device` field, the
machine (its GPUs, the trainer's LOCAL_RANK) and the role, on simulated machines; and, where CUDA
is present, the engines on the devices the decision names."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distill.config import ConfigError
from distill.engines.placement import Machine, PlacementError, cpu_note, place, this_machine

CPU_ONLY = Machine(gpus=0)
ONE_GPU = Machine(gpus=1, names=("NVIDIA H200",))
TWO_GPUS = Machine(gpus=2, names=("NVIDIA H100 80GB HBM3",) * 2)
# Two trainer processes on a node of four GPUs, this one of rank 1.
RANK1_OF_2_ON_4 = Machine(gpus=4, local_rank=1, local_world_size=2)
RANK1_OF_2_ON_3 = Machine(gpus=3, local_rank=1, local_world_size=2)


@pytest.mark.parametrize(
    ("requested", "role", "machine", "device"),
    [
        # auto: the trainer's GPU when there is one, else the CPU.
        ("auto", "student", CPU_ONLY, "cpu"),
        ("auto", "teacher", CPU_ONLY, "cpu"),
        ("auto", "teacher_worker", CPU_ONLY, "cpu"),
        ("auto", "student", ONE_GPU, "cuda:0"),
        ("auto", "teacher", ONE_GPU, "cuda:0"),
        ("auto", "teacher_worker", ONE_GPU, "cuda:0"),  # no spare GPU: shares the trainer's
        ("auto", "student", TWO_GPUS, "cuda:0"),
        ("auto", "teacher", TWO_GPUS, "cuda:0"),
        ("auto", "teacher_worker", TWO_GPUS, "cuda:1"),  # a GPU no trainer uses
        ("auto", "student", RANK1_OF_2_ON_4, "cuda:1"),
        ("auto", "teacher", RANK1_OF_2_ON_4, "cuda:1"),
        ("auto", "teacher_worker", RANK1_OF_2_ON_4, "cuda:3"),
        # cuda: what auto picks, on a machine that has a GPU.
        ("cuda", "student", TWO_GPUS, "cuda:0"),
        ("cuda", "teacher_worker", TWO_GPUS, "cuda:1"),
        ("cuda", "teacher", RANK1_OF_2_ON_4, "cuda:1"),
        # cuda:N pins; cpu pins.
        ("cuda:1", "teacher", TWO_GPUS, "cuda:1"),
        ("cuda:0", "teacher_worker", TWO_GPUS, "cuda:0"),
        ("cuda:1", "student", RANK1_OF_2_ON_4, "cuda:1"),
        ("cpu", "student", TWO_GPUS, "cpu"),
        ("cpu", "teacher", ONE_GPU, "cpu"),
        ("cpu", "teacher_worker", CPU_ONLY, "cpu"),
    ],
)
def test_decision_table(requested: str, role: Any, machine: Machine, device: str) -> None:
    assert place(requested, role, machine) == device


@pytest.mark.parametrize(
    ("requested", "role", "machine", "message"),
    [
        ("cuda", "teacher", CPU_ONLY, "teacher.device=cuda: torch sees no GPU on this machine"),
        ("cuda:0", "student", CPU_ONLY, "student.device=cuda:0: torch sees no GPU"),
        ("cuda", "teacher_worker", CPU_ONLY, "teacher.device=cuda: torch sees no GPU"),
        ("cuda:2", "teacher", TWO_GPUS, r"teacher.device=cuda:2: this machine has 2 GPUs .*cuda:0-cuda:1"),
        (
            "cuda:1",
            "student",
            TWO_GPUS,
            r"student.device=cuda:1: the student trains on its trainer's GPU, cuda:0",
        ),
        (
            "auto",
            "student",
            Machine(gpus=1, local_rank=1, local_world_size=2),
            "LOCAL_RANK=1 but only 1 GPU is",
        ),
        ("gpu", "teacher", ONE_GPU, "teacher.device='gpu': want auto, cpu, cuda or cuda:N"),
    ],
)
def test_refusals_are_one_line_naming_the_field(
    requested: str, role: Any, machine: Machine, message: str
) -> None:
    with pytest.raises(PlacementError, match=message) as info:
        place(requested, role, machine)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ConfigError)  # the CLI's one-line refusal, exit code 2


# Two teachers' workers for each trainer process: (worker index, workers a process) -> GPU.
@pytest.mark.parametrize(
    ("machine", "worker", "device"),
    [
        (Machine(gpus=3), (0, 2), "cuda:1"),
        (Machine(gpus=3), (1, 2), "cuda:2"),
        (ONE_GPU, (1, 2), "cuda:0"),  # no spare GPU at all: every worker on its trainer's
        (Machine(gpus=6, local_rank=1, local_world_size=2), (0, 2), "cuda:4"),
        (Machine(gpus=6, local_rank=1, local_world_size=2), (1, 2), "cuda:5"),
    ],
)
def test_each_teacher_worker_gets_a_spare_gpu_of_its_own(machine: Machine, worker: Any, device: str) -> None:
    assert place("auto", "teacher_worker", machine, worker=worker) == device


@pytest.mark.parametrize(
    ("machine", "worker", "message"),
    [
        (TWO_GPUS, (1, 2), "2 teacher workers for each of 1 trainer process needs 2 spare GPUs"),
        (RANK1_OF_2_ON_3, (0, 1), "a teacher worker for each of 2 trainer processes needs 2 spare GPUs"),
    ],
)
def test_workers_that_do_not_fit_the_spare_gpus_are_refused(
    machine: Machine, worker: Any, message: str
) -> None:
    with pytest.raises(PlacementError, match=message) as info:
        place("auto", "teacher_worker", machine, "teachers.dapo.device", worker=worker)
    assert str(info.value).startswith("teachers.dapo.device: ") and "\n" not in str(info.value)


def test_an_unknown_role_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="role must be one of"):
        place("auto", "eval", ONE_GPU)  # type: ignore[arg-type]


def test_the_cpu_note_is_one_line_and_only_beside_a_gpu() -> None:
    assert cpu_note({"student.device": "cpu", "teacher.device": "cpu"}, CPU_ONLY) is None
    assert cpu_note({"student.device": "cuda:0", "teacher.device": "cuda:0"}, ONE_GPU) is None
    note = cpu_note({"student.device": "cuda:0", "teacher.device": "cpu"}, ONE_GPU)
    assert note == (
        "note: teacher (teacher.device=cpu) on the CPU beside 1 GPU (NVIDIA H200): "
        "teacher.device=auto puts it on the GPU"
    )
    both = cpu_note({"student.device": "cpu", "teacher.device": "cpu"}, TWO_GPUS)
    assert both is not None and "\n" not in both
    assert "student (student.device=cpu) and teacher (teacher.device=cpu)" in both
    assert "2 GPUs (NVIDIA H100 80GB HBM3 x2)" in both and "puts them on the GPU" in both


def test_this_machine_reads_accelerates_local_rank() -> None:
    machine = this_machine({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (machine.local_rank, machine.local_world_size) == (1, 2)
    assert machine.gpus == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    plain = this_machine({})
    assert (plain.local_rank, plain.local_world_size) == (0, 1)
    with pytest.raises(PlacementError, match="LOCAL_RANK='x' is not an integer"):
        this_machine({"LOCAL_RANK": "x"})


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: engines on the GPU")


@needs_cuda
@pytest.mark.integration
def test_each_engine_is_on_the_gpu_placement_names(tiny_zoo: Any) -> None:
    """On a GPU machine: the student, the in-process teacher and the teacher's worker land where
    `place` says (auto), their scores agree with the CPU's, and the worker hands back host tensors."""
    from distill.engines.hf import HFEngine
    from distill.engines.worker import WorkerEngine

    machine = this_machine()
    devices = {role: place("auto", role, machine) for role in ("student", "teacher", "teacher_worker")}
    assert all(d.startswith("cuda:") for d in devices.values())
    student = HFEngine.load(str(tiny_zoo.student), device=devices["student"])
    teacher = HFEngine.load(str(tiny_zoo.teacher), device=devices["teacher"])
    assert str(student.model.device) == student.describe()["device"] == devices["student"]
    assert str(teacher.model.device) == teacher.describe()["device"] == devices["teacher"]
    prompts = [teacher.prompt_ids("Sort: 3 1 2")]
    completions = [teacher.tokenizer.encode("1 2 3")[:4]]
    on_gpu = teacher.score(prompts, completions, top_k=3)
    assert on_gpu.logprobs_B_T.device == teacher.model.device
    on_cpu = HFEngine.load(str(tiny_zoo.teacher)).score(prompts, completions, top_k=3)
    torch.testing.assert_close(on_gpu.logprobs_B_T.cpu(), on_cpu.logprobs_B_T, atol=1e-4, rtol=0)
    worker = WorkerEngine(str(tiny_zoo.teacher), threads=1, device=devices["teacher_worker"])
    try:
        assert worker.device == devices["teacher_worker"]
        remote = worker.score(prompts, completions, top_k=3)
        assert remote.logprobs_B_T.device.type == "cpu"
        torch.testing.assert_close(remote.logprobs_B_T, on_cpu.logprobs_B_T, atol=1e-4, rtol=0)
    finally:
        worker.close()
