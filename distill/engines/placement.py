"""Where each model runs: a model's `device` field, the machine and the model's role -> a torch
device string. The decision is a pure function of its arguments (`place`); `this_machine` reads
what the process sees (torch's CUDA devices, accelerate's LOCAL_RANK / LOCAL_WORLD_SIZE).

The rules (DESIGN.md: every model runs where it belongs, and a model left on the CPU beside a GPU
is said at start):

- `auto`: the GPU the trainer uses when there is one (`cuda:LOCAL_RANK`: accelerate gives each
  trainer process of a node the GPU of its local rank), else the CPU. A teacher's worker process
  (`rollout.async_teacher`, engines/worker.py) takes a GPU no trainer process uses: each worker
  of each trainer process a spare GPU of its own. A node with no spare GPU puts them on their
  trainer's; one with spare GPUs, but fewer than the workers, is refused (two workers on one
  spare GPU would each count on all of it).
- `cuda`: what `auto` picks, but a machine without a GPU is an error (one line naming the field).
- `cuda:N`: that GPU, which must exist. The student trains where its trainer puts it, so a
  student pinned to another GPU than its trainer's is refused (the trainer would move it, and the
  manifest would name a device it never trained on).
- `cpu`: the CPU; beside a GPU that is said at start (`cpu_note`).

A model nobody trains (an eval's, a teacher's) may go to any GPU. CUDA_VISIBLE_DEVICES picks
which physical GPUs a process sees; indices here are the visible ones.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from distill.config import ConfigError

Role = Literal["student", "teacher", "teacher_worker"]
ROLES: tuple[Role, ...] = ("student", "teacher", "teacher_worker")
PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class PlacementError(ConfigError):
    """A one-line, user-facing refusal naming the config field: a ConfigError, so the CLI refuses
    the run with exit code 2 when it is raised before anything is written."""


@dataclass(frozen=True)
class Machine:
    """What this process sees: its CUDA devices and its place among the node's trainer processes."""

    gpus: int = 0
    # This trainer process's index on the node, and how many there are (accelerate / torchrun).
    local_rank: int = 0
    local_world_size: int = 1
    # The GPUs' names, for the start-up note (empty when unknown).
    names: tuple[str, ...] = ()

    def gpu_words(self) -> str:
        """'1 GPU (NVIDIA H200)', '2 GPUs (NVIDIA H100 80GB HBM3 x2)'."""
        count = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        kinds = sorted(set(self.names))
        if not kinds:
            return count
        named = ", ".join(f"{k} x{self.names.count(k)}" if self.names.count(k) > 1 else k for k in kinds)
        return f"{count} ({named})"


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise PlacementError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise PlacementError(f"{name}={value} is negative")
    return value


def this_machine(environ: Mapping[str, str] | None = None) -> Machine:
    """The machine as this process sees it (torch's CUDA devices; LOCAL_RANK and LOCAL_WORLD_SIZE
    from `environ`, default os.environ)."""
    import torch

    env = os.environ if environ is None else environ
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = tuple(torch.cuda.get_device_name(i) for i in range(gpus))
    return Machine(
        gpus=gpus,
        local_rank=_env_int(env, "LOCAL_RANK", 0),
        local_world_size=max(1, _env_int(env, "LOCAL_WORLD_SIZE", 1)),
        names=names,
    )


def field_of(role: Role) -> str:
    """The config field a role's device comes from (the worker holds the teacher)."""
    return "student.device" if role == "student" else "teacher.device"


def _auto_gpu(role: Role, machine: Machine, field: str, worker: tuple[int, int] = (0, 1)) -> int:
    """The GPU `auto` picks on a machine that has one; `worker`: (this worker's index, the
    workers of each trainer process) for a teacher's worker."""
    if machine.local_rank >= machine.gpus:
        raise PlacementError(
            f"{field}: this is trainer process LOCAL_RANK={machine.local_rank} but only "
            f"{machine.gpus} GPU{'s are' if machine.gpus != 1 else ' is'} visible"
        )
    spare = machine.gpus - machine.local_world_size
    if role == "teacher_worker" and spare > 0:
        # The GPUs past the node's trainer processes are nobody's: one a worker, in rank order.
        index, count = worker
        wanted = machine.local_world_size * count
        if spare < wanted:
            each = f"{count} teacher workers for each of" if count > 1 else "a teacher worker for each of"
            raise PlacementError(
                f"{field}: {each} {machine.local_world_size} trainer process"
                f"{'es' if machine.local_world_size > 1 else ''} needs {wanted} spare GPUs, and "
                f"{machine.gpu_words()} leave {spare} past the trainers'; pin each teacher's device "
                "(cuda:N or cpu)"
            )
        return machine.local_world_size + machine.local_rank * count + index
    return machine.local_rank


def place(
    requested: str, role: Role, machine: Machine, field: str | None = None, worker: tuple[int, int] = (0, 1)
) -> str:
    """The torch device a `role` model goes to when its config asks for `requested` (auto, cpu,
    cuda, cuda:N) on `machine`; raises PlacementError (one line naming `field`) when it cannot.
    `worker`: a teacher worker's (index, count) among the workers each trainer process starts."""
    field = field or field_of(role)
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not PATTERN.match(requested):
        raise PlacementError(f"{field}={requested!r}: want auto, cpu, cuda or cuda:N")
    if requested == "cpu" or (requested == "auto" and machine.gpus == 0):
        return "cpu"
    if machine.gpus == 0:
        raise PlacementError(
            f"{field}={requested}: torch sees no GPU on this machine; use {field}=auto or {field}=cpu"
        )
    if requested in ("auto", "cuda"):
        return f"cuda:{_auto_gpu(role, machine, field, worker)}"
    index = int(requested.split(":")[1])
    if index >= machine.gpus:
        last = f"cuda:0-cuda:{machine.gpus - 1}" if machine.gpus > 1 else "cuda:0"
        raise PlacementError(f"{field}={requested}: this machine has {machine.gpu_words()}: {last}")
    trainer = _auto_gpu("student", machine, field)
    if role == "student" and index != trainer:
        raise PlacementError(
            f"{field}={requested}: the student trains on its trainer's GPU, cuda:{trainer} "
            f"(LOCAL_RANK={machine.local_rank}); use {field}=auto, or CUDA_VISIBLE_DEVICES to pick the GPU"
        )
    return requested


def cpu_note(placed: Mapping[str, str], machine: Machine) -> str | None:
    """The one line to print at a run's start when a model is left on the CPU while a GPU is
    present (None otherwise). `placed`: the config field of each model -> the device `place` gave
    it, e.g. {"student.device": "cuda:0", "teacher.device": "cpu"}."""
    if machine.gpus == 0:
        return None
    on_cpu = [field for field, device in placed.items() if device == "cpu"]
    if not on_cpu:
        return None
    which = " and ".join(f"{field.removesuffix('.device')} ({field}=cpu)" for field in on_cpu)
    return (
        f"note: {which} on the CPU beside {machine.gpu_words()}: "
        f"{' / '.join(f'{field}=auto' for field in on_cpu)} puts {'them' if len(on_cpu) > 1 else 'it'} on the GPU"
    )
