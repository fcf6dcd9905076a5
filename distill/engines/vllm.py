"""The `vllm` rollout engine: the student's rollouts through TRL's own vLLM integration.

distill does not drive vLLM itself for the student: the TRL trainer the on-policy methods run on
(`GRPOTrainer`, distill/methods/opd.py) already generates with vLLM, colocated in each training
process or on a `trl vllm-serve` server it syncs weights to every step. This module turns
`rollout.*` into those trainer arguments and fails early, with the reason, where that cannot work.
The teacher behind a vLLM server is the other engine (distill/engines/server.py).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distill.config import RolloutConfig, RunConfig

# Methods whose student rollouts come from a TRL trainer's generation path.
TRL_ROLLOUT_METHODS = ("opd", "opsd")


def unsupported_reason(config: RunConfig, check_install: bool = True) -> str | None:
    """Why `rollout.engine=vllm` cannot run this config (None: it can). The config check skips the
    install check (`check_install=False`): a GPU config may be written on a machine without vLLM."""
    if config.rollout.engine != "vllm":
        return None
    if config.method.name not in TRL_ROLLOUT_METHODS or config.domain.name == "sciworld":
        return (
            f"rollout.engine=vllm runs through TRL's GRPO trainer, which only {', '.join(TRL_ROLLOUT_METHODS)} "
            f"use (not {config.method.name} on {config.domain.name}); use rollout.engine=hf"
        )
    if check_install and importlib.util.find_spec("vllm") is None:
        return (
            "rollout.engine=vllm needs the vllm package in distill's own environment (a GPU machine: "
            "`pip install vllm`); use rollout.engine=hf on CPU, or serve the teacher with `distill serve teacher`"
        )
    return None


def trainer_args(rollout: RolloutConfig) -> dict[str, Any]:
    """`GRPOConfig` arguments for the student's rollout engine."""
    if rollout.engine != "vllm":
        return {"use_vllm": False}
    args: dict[str, Any] = {
        "use_vllm": True,
        "vllm_mode": rollout.vllm_mode,
        "vllm_gpu_memory_utilization": rollout.vllm_gpu_memory_utilization,
        "vllm_tensor_parallel_size": rollout.vllm_tensor_parallel_size,
    }
    if rollout.vllm_mode == "server":
        args["vllm_server_base_url"] = rollout.vllm_server_url
    return args
