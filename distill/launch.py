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
from collections.abc import Callable
from dataclasses import dataclass
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


def _flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def strategy() -> str:
    """How this process's launcher spreads the student: `fsdp` (FSDP, sharded per layer), `zero3`
    (DeepSpeed ZeRO-3), `deepspeed` (a lower ZeRO stage), `ddp` (replicated), `single`."""
    if _flag("ACCELERATE_USE_FSDP"):
        return "fsdp"
    if _flag("ACCELERATE_USE_DEEPSPEED"):
        return "zero3" if os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3" else "deepspeed"
    return "ddp" if world_size() > 1 else "single"


def sharded() -> bool:
    """The launcher shards the student (DeepSpeed ZeRO / FSDP) rather than replicating it (DDP)."""
    return strategy() in ("fsdp", "zero3", "deepspeed")


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
    if strategy() == "fsdp" and not torch.cuda.is_available():
        _cpu_fsdp_state()
    if strategy() in ("zero3", "deepspeed") and not torch.cuda.is_available():
        _skip_deepspeed_shm_kernel()


def _cpu_fsdp_state() -> None:
    """accelerate's own FSDP path is GPU-only: on a CPU-only host it quietly trains the config's
    FSDP run as data parallel. torch's `fully_shard` runs on CPU over gloo, so distill configures
    accelerate's state as FSDP itself; the trainers reuse it (`configured_state`)."""
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = Accelerator(cpu=True).state
    state.fsdp_plugin = FullyShardedDataParallelPlugin()  # from accelerate launch's FSDP_* environment
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def configured_state() -> bool:
    """This process configured accelerate's state itself (FSDP on CPU): a trainer must use it
    (`accelerator_config={"use_configured_state": True}`) instead of building its own."""
    if strategy() != "fsdp" or world_size() <= 1:
        return False
    from accelerate.state import AcceleratorState

    return AcceleratorState._shared_state.get("fsdp_plugin") is not None


def _skip_deepspeed_shm_kernel() -> None:
    """DeepSpeed on CPU compiles a shared-memory all-reduce kernel (minutes of C++) on its first
    run; it serves tensor-parallel inference only (`inference_all_reduce`), never ZeRO training,
    which all-gathers and reduce-scatters over gloo. DeepSpeed keeps the probed op table in one
    dict for the process, so marking the op unavailable there skips the build."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


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


def token_share(count: int, device: Any) -> float:
    """world size x this process's share of the step's tokens (1.0 in one process): a loss that is a
    mean over this process's `count` tokens, times this, averages over the processes (what DDP,
    FSDP and ZeRO do to gradients) to the mean over all of their tokens, as one process computes it."""
    if not _group_ready():
        return 1.0
    return world_size() * count / max(summed(count, device), 1.0)


def summed(count: float, device: Any) -> float:
    """`count` summed over the processes (itself in one process); a collective every process joins."""
    if not _group_ready():
        return float(count)
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(count)], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return float(total.item())


def per_device(total: int, field: str) -> int:
    """A global batch figure split over the ranks; the config always means the global batch."""
    n = world_size()
    if total % n:
        raise ValueError(f"{field}={total} is not divisible by the {n} training processes")
    return total // n


@dataclass(frozen=True)
class Plan:
    """How a run is launched: the strategy (`strategy()`'s words, `fsdp1` for FSDP version 1) and
    the number of training processes."""

    strategy: str
    processes: int

    @property
    def sharded(self) -> bool:
        return self.strategy in ("fsdp", "fsdp1", "zero3", "deepspeed")


def plan_here() -> Plan:
    """The plan of this process (inside `accelerate launch`, or one process without it)."""
    kind = strategy()
    if kind == "fsdp" and os.environ.get("FSDP_VERSION", "2") != "2":
        kind = "fsdp1"
    return Plan(_as_trained(kind, world_size()), world_size())


def _as_trained(kind: str, processes: int) -> str:
    """What an FSDP launch over one process trains as: without CUDA distill sets FSDP up itself
    only over several processes (`configured_state`), so one process trains unsharded and reads
    and writes one process's checkpoints."""
    if kind == "fsdp" and processes <= 1:
        import torch

        if not torch.cuda.is_available():
            return "single"
    return kind


def plan_of(config_file: Path | None, num_processes: int | None) -> Plan:
    """The plan `accelerate launch [--config_file F] [--num_processes N]` would run (read from the
    accelerate config file, as accelerate reads it); a file accelerate cannot use is refused."""
    fields: dict[str, Any] = {}
    if config_file is not None:
        import yaml

        try:
            fields = yaml.safe_load(config_file.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"--accelerate-config {config_file}: not a readable YAML file ({exc})") from None
        if not isinstance(fields, dict):
            raise ValueError(f"--accelerate-config {config_file}: not an accelerate config (a mapping)")
    processes = num_processes if num_processes is not None else int(fields.get("num_processes") or 1)
    kind = str(fields.get("distributed_type", "NO")).upper()
    if kind == "FSDP":
        version = str((fields.get("fsdp_config") or {}).get("fsdp_version", 1))
        return Plan(_as_trained("fsdp", processes) if version == "2" else "fsdp1", processes)
    if kind == "DEEPSPEED":
        stage = str((fields.get("deepspeed_config") or {}).get("zero_stage", ""))
        return Plan("zero3" if stage == "3" else "deepspeed", processes)
    return Plan("ddp" if processes > 1 else "single", processes)


def launch_refusal(config: Any, plan: Plan) -> str | None:
    """Why `config` cannot train as `plan` says (one line naming the fields), or None. Checked
    before the run exists, in the `distill run` that starts the launcher and again in rank 0."""
    if plan.strategy in ("zero3", "deepspeed") and not _installed("deepspeed"):
        return (
            "the accelerate config asks for DeepSpeed, which is not installed: "
            "pip install 'distill[sharded]' (deepspeed)"
        )
    if plan.strategy == "fsdp1":
        return "fsdp_config.fsdp_version=1: distill shards the student with FSDP2; set fsdp_version: 2"
    if plan.sharded and config.lora.enabled:
        return (
            "lora.enabled=true trains adapters on a whole student: use DDP (configs/accelerate/ddp.yaml), "
            "not FSDP or DeepSpeed"
        )
    if plan.sharded and getattr(config.domain, "optimizer_state", "shared") == "per_domain":
        # Each domain's optimizer state is swapped in whole (methods/alternate.py).
        return (
            "domain.optimizer_state=per_domain keeps each domain's optimizer state whole: "
            "use DDP (configs/accelerate/ddp.yaml) or one process, not FSDP or DeepSpeed"
        )
    from distill import teacher_shard

    if reason := teacher_shard.refusal(config, plan.strategy):
        return reason
    field = "optim.batch_size" if config.method.name == "sft" else "rollout.prompts_per_step"
    total = config.optim.batch_size if field == "optim.batch_size" else config.rollout.prompts_per_step
    if total % plan.processes:
        return f"{field}={total} is not divisible by the {plan.processes} training processes"
    return None


def refusal(plan: Plan, config: Any, settings: Any, resume: str | None) -> str | None:
    """Why a new run (`config`) or a resumed one (`resume`, a run id or path) cannot go as `plan`
    says, or None; nothing in the run's directory is touched."""
    if resume is None:
        return None if config is None else launch_refusal(config, plan)
    from distill.tracking.rundir import RunDir

    run = RunDir.find(settings, resume)
    return launch_refusal(run.read_config(), plan) or resume_refusal(run.last_checkpoint(), plan)


# What a checkpoint folder records of the launch that wrote it (DistillCallback.on_save).
LAUNCH_FILE = "distill_launch.json"


def record_launch(folder: Path) -> None:
    """Write this process's plan into a checkpoint folder, for `resume_refusal`."""
    import json

    plan = plan_here()
    (folder / LAUNCH_FILE).write_text(json.dumps({"strategy": plan.strategy, "processes": plan.processes}))


def resume_refusal(checkpoint: Path | None, plan: Plan) -> str | None:
    """Why `plan` cannot continue from `checkpoint` (one line), or None. FSDP checkpoints hold the
    full model and optimizer state, re-sharded over any number of FSDP processes, and DDP's and one
    process's are the same files; ZeRO shards its optimizer state per process, and each family
    stores its optimizer state in its own file, which another would silently skip."""
    if checkpoint is None or not (checkpoint / LAUNCH_FILE).exists():
        return None
    import json

    wrote = json.loads((checkpoint / LAUNCH_FILE).read_text())
    was, count = str(wrote["strategy"]), int(wrote["processes"])
    family = {"single": "plain", "ddp": "plain"}
    if family.get(was, was) == family.get(plan.strategy, plan.strategy) and (
        plan.strategy not in ("zero3", "deepspeed") or count == plan.processes
    ):
        return None
    how = {
        "single": "one process",
        "ddp": "DDP",
        "fsdp": "FSDP2",
        "zero3": "ZeRO-3",
        "deepspeed": "DeepSpeed",
    }
    return (
        f"{checkpoint.name} was written by {how.get(was, was)} over {count} process(es); resume it "
        f"with the same launcher{' and process count' if was in ('zero3', 'deepspeed') else ''} "
        f"(this launch: {how.get(plan.strategy, plan.strategy)} over {plan.processes})"
    )


def resume_note(checkpoint: Path | None, plan: Plan) -> str | None:
    """The line a resume over another number of processes prints (None: the same number)."""
    if checkpoint is None or not (checkpoint / LAUNCH_FILE).exists():
        return None
    import json

    count = int(json.loads((checkpoint / LAUNCH_FILE).read_text())["processes"])
    if count == plan.processes:
        return None
    return (
        f"resuming over {plan.processes} process(es) from {checkpoint.name}, written by {count}: the model "
        "and optimizer state are whole in it and re-split; the data order and sampling continue "
        "from the same step but not bit for bit as an uninterrupted run"
    )


def _installed(package: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None
    except ValueError:  # a module set to None in sys.modules: not importable
        return False


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
    check: Callable[[Plan], str | None] | None = None,
) -> None:
    """Replace this process by `accelerate launch`: its exit status is the run's. `check` says
    why the run cannot go as the launch plan says (launch_refusal, resume_refusal): then nothing
    is started, and no process or run directory exists."""
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
    if check is not None and (reason := check(plan_of(config_file, num_processes))):
        raise ValueError(reason)
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
