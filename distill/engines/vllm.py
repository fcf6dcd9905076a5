"""The `vllm` rollout engine: the student's rollouts through TRL's own vLLM integration.

distill does not drive vLLM itself for the student: the TRL trainer the on-policy methods run on
(`GRPOTrainer`, distill/methods/opd.py) already generates with vLLM, colocated in each training
process or on a `trl vllm-serve` server it syncs weights to every step. This module turns
`rollout.*` into those trainer arguments; `compat.py` says where that cannot work.
The teacher behind a vLLM server is the other engine (distill/engines/server.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distill.config import RolloutConfig


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
