"""Multi-process training through accelerate: the re-exec, the ranks, and what rank 0 alone does.

`distill run --launcher accelerate` re-executes itself as `accelerate launch ... -m distill run`;
`accelerate launch -m distill run ...` typed by hand is the same thing. Every process then runs
`runner.execute`: rank 0 creates the run directory and the MLflow run and tells the others where
it is (a broadcast over the process group the trainer uses anyway); the other ranks load the same
config from that directory and train (`runner.train_worker`). Only rank 0 logs, evaluates, writes
checkpoints and the summary; TRL's trainers do the data parallelism (DDP, DeepSpeed, FSDP) through
accelerate. No home-made distributed layer: torch.distributed is used for three small agreements
(the run directory, the per-step figures, "every rank has written its checkpoint part").
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

# Flags of `distill run` that choose the launcher; they are not passed on to the launched processes.
LAUNCHER_FLAGS = ("--launcher", "--accelerate-config", "--num-processes")
# Rank 0 evaluates (before training, every eval.every_steps, after) while the other ranks wait in
# the trainer's first collective; torch's 30-minute default is shorter than a real model's eval.
PROCESS_GROUP_TIMEOUT = timedelta(hours=4)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    return rank() == 0


def sharded() -> bool:
    """The launcher shards the student (DeepSpeed ZeRO / FSDP) rather than replicating it (DDP)."""
    return any(
        os.environ.get(flag, "").lower() in ("1", "true", "yes")
        for flag in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP")
    )


def launched() -> bool:
    """Inside a process started by a launcher (accelerate / torchrun / deepspeed)."""
    return "LOCAL_RANK" in os.environ


STOPPED_MESSAGE = (
    "LauncherStopped: the launcher stopped this process (SIGTERM): another training process failed or "
    "the job was cancelled; see error-rank*.log in the run directory"
)
_stopped = False


class LauncherStopped(RuntimeError):
    """The launcher sent SIGTERM: another process failed, or the job was cancelled."""


def _raise_stopped(signum: int, frame: Any) -> None:
    global _stopped
    _stopped = True
    raise LauncherStopped(STOPPED_MESSAGE.split(": ", 1)[1])


def stopped_message() -> str | None:
    """Why this process is failing, when it is because the launcher stopped it."""
    return STOPPED_MESSAGE if _stopped else None


def init_distributed() -> None:
    """Join the process group now (the trainer would later), so ranks can agree on the run dir."""
    if world_size() <= 1:
        return
    import signal

    import torch
    from accelerate import PartialState

    if is_main_process():
        # torchrun stops the other processes with SIGTERM when one fails: as an exception, rank 0
        # still marks the run FAILED (summary and MLflow) instead of leaving it RUNNING.
        signal.signal(signal.SIGTERM, _raise_stopped)

    # cpu=True without CUDA: accelerate then uses gloo (its MULTI_CPU type) for torchrun processes.
    PartialState(cpu=not torch.cuda.is_available(), timeout=PROCESS_GROUP_TIMEOUT)


def _group_ready() -> bool:
    if world_size() <= 1:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def broadcast(value: Any) -> Any:
    """Rank 0's `value` on every rank (the others pass anything, typically None)."""
    if not _group_ready():
        return value
    import torch.distributed as dist

    box = [value if is_main_process() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if _group_ready():
        import torch.distributed as dist

        dist.barrier()


def reduce_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """One figure per key for the whole step: `*_max` the max, `_tokens` the sum, others the mean."""
    if not _group_ready():
        return metrics
    import torch.distributed as dist

    gathered: list[Any] = [None] * world_size()
    dist.all_gather_object(gathered, metrics)
    out: dict[str, float] = {}
    for key in sorted({k for part in gathered for k in part}):
        values = [float(part[key]) for part in gathered if key in part]
        if key.endswith("_max"):
            out[key] = max(values)
        elif key == "_tokens":
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def per_device(total: int, field: str) -> int:
    """A global batch figure split over the ranks; the config always means the global batch."""
    n = world_size()
    if total % n:
        raise ValueError(f"{field}={total} is not divisible by the {n} training processes")
    return total // n


def strip_launcher_flags(args: list[str]) -> list[str]:
    """`run` arguments without --launcher/--accelerate-config/--num-processes (both spellings)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in LAUNCHER_FLAGS:
            skip = True
            continue
        if arg.startswith(tuple(f"{flag}=" for flag in LAUNCHER_FLAGS)):
            continue
        out.append(arg)
    return out


def accelerate_argv(run_args: list[str], config_file: Path | None, num_processes: int | None) -> list[str]:
    """The `accelerate launch ... -m distill run ...` command line for `distill run --launcher accelerate`."""
    argv = [sys.executable, "-m", "accelerate.commands.launch"]
    if config_file is not None:
        if not config_file.is_file():
            raise ValueError(f"--accelerate-config: no such file {config_file}")
        argv += ["--config_file", str(config_file)]
    if num_processes is not None:
        argv += ["--num_processes", str(num_processes)]
        if config_file is None and not _default_config_exists():
            # Without any config file accelerate asks for these; with more than one process the
            # torchrun path (also right on a CPU-only host, see configs/accelerate/cpu-ddp.yaml).
            argv += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
            if num_processes > 1:
                argv += ["--multi_gpu", "--main_process_port", "0"]
    return [*argv, "-m", "distill", *strip_launcher_flags(run_args)]


def _default_config_exists() -> bool:
    """`accelerate config` wrote a default file (it then chooses the launcher, not distill)."""
    from accelerate.commands.config import default_config_file

    return Path(default_config_file).is_file()


def exec_accelerate(
    launcher: str | None,
    run_args: list[str],
    config_file: Path | None,
    num_processes: int | None,
    preflight: bool = False,
) -> None:
    """Replace this process by `accelerate launch`: its exit status is the run's."""
    if launcher is None:
        raise ValueError("--accelerate-config and --num-processes go with --launcher accelerate")
    if launcher != "accelerate":
        raise ValueError(f"--launcher {launcher!r}: the only launcher is 'accelerate'")
    if preflight:
        raise ValueError("--preflight checks in one process; drop --launcher")
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"--num-processes must be at least 1, got {num_processes}")
    if launched():
        raise ValueError("already running under a launcher (LOCAL_RANK is set); drop --launcher")
    argv = accelerate_argv(run_args, config_file, num_processes)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def set_parent_death_signal() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (a child started with this as
    `preexec_fn` never outlives a SIGKILLed parent)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the child's own end-of-pipe handling still ends it
        pass
