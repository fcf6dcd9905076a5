"""The grid's own settings (not a run's): where and how its cells run. Read from `--settings FILE`
(a YAML file with a `slurm:` section) and `slurm.KEY=VALUE` words among the grid's overrides;
validated once, every error one line naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from distill.config import ConfigError, Strict, format_validation_error, parse_override, read_yaml, set_dotted

Executor = Literal["local", "slurm"]
# The signal SLURM sends a cell before its time limit (`--signal`) or at preemption: submitit's own
# (`SUBMITIT_PREEMPT_SIGNAL`, USR2 by default), which its job handler catches to requeue the job.
REQUEUE_SIGNAL = "USR2"


class SlurmSettings(Strict):
    """One SLURM job per cell, every cell asking for the same resources (one job array)."""

    partition: str | None = None  # None: the cluster's default partition
    account: str | None = None
    qos: str | None = None
    # The cell's wall-clock limit in minutes. A cell that reaches it is signalled `signal_delay_s`
    # before, checkpoints at its next step boundary and is requeued; it continues from there.
    time_min: int = Field(60, ge=1)
    # How long before the time limit SLURM signals the cell: one training step plus one
    # checkpoint save must fit in it (SLURM may send it up to a minute earlier).
    signal_delay_s: int = Field(120, ge=10)
    # How many times a cell may be requeued at its time limit before it is left TIMEOUT.
    max_requeues: int = Field(3, ge=0)
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    cpus_per_task: int = Field(1, ge=1)
    mem_gb: float | None = Field(None, gt=0)
    # Cells of the grid SLURM may run at once (the job array's `%N`).
    max_running: int = Field(64, ge=1)
    # Extra `#SBATCH` lines, as sbatch options: ["--constraint=a100", "--exclusive"].
    sbatch: list[str] = []
    # Shell lines run before the cell in its job (module loads, the venv's activate).
    setup: list[str] = []
    # The cell's launcher: one `distill run` process, or `accelerate launch` over the cell's GPUs
    # and nodes (one process per GPU; `accelerate_config` for DeepSpeed / FSDP).
    launcher: Literal["process", "accelerate"] = "process"
    accelerate_config: Path | None = None
    # The python that runs the cells on the nodes (default: the one that submits).
    python: str | None = None

    @model_validator(mode="after")
    def _launcher(self) -> SlurmSettings:
        if self.nodes > 1 and self.launcher != "accelerate":
            raise ValueError("nodes: a cell over several nodes needs launcher: accelerate")
        if self.accelerate_config is not None and self.launcher != "accelerate":
            raise ValueError("accelerate_config: goes with launcher: accelerate")
        for line in self.sbatch:
            if not line.startswith("--"):
                raise ValueError(f"sbatch: {line!r} is no sbatch option (e.g. --constraint=a100)")
        return self

    def processes(self) -> int:
        """Training processes of one cell: one per GPU over its nodes (one per node on CPUs)."""
        return self.nodes * max(1, self.gpus_per_node)

    def parameters(self) -> dict[str, Any]:
        """submitit's SlurmExecutor parameters (its names for sbatch's options)."""
        params: dict[str, Any] = {
            "time": self.time_min,
            "nodes": self.nodes,
            "ntasks_per_node": 1,  # one cell launcher per node; accelerate starts the ranks
            "cpus_per_task": self.cpus_per_task,
            "signal_delay_s": self.signal_delay_s,
            "array_parallelism": self.max_running,
            "setup": list(self.setup),
            "stderr_to_stdout": True,
        }
        for key in ("partition", "account", "qos"):
            if getattr(self, key) is not None:
                params[key] = getattr(self, key)
        if self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        if self.mem_gb is not None:
            params["mem"] = f"{int(self.mem_gb * 1024)}MB"
        extra = {}
        for line in self.sbatch:
            key, sep, value = line[2:].partition("=")
            extra[key] = value if sep else True
        if extra:
            params["additional_parameters"] = extra
        return params


class GridSettings(Strict):
    slurm: SlurmSettings = SlurmSettings()


def is_setting(text: str) -> bool:
    """`slurm.partition=gpu` among the grid's overrides is the grid's, not a run's."""
    return text.split("=", 1)[0].split(".", 1)[0] == "slurm"


def load_settings(path: Path | None, overrides: list[str]) -> GridSettings:
    """The settings file (if any) <- `slurm.KEY=VALUE` overrides, validated."""
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(data, key, value)
    try:
        return GridSettings.model_validate(data)
    except ValidationError as exc:
        where = f"{path}: " if path is not None else ""
        raise ConfigError(where + format_validation_error(exc)) from None
