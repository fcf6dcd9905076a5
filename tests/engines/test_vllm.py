"""The `vllm` rollout engine: `rollout.*` becomes TRL's own vLLM arguments, and configs that cannot
use it (another method, no vllm package here) stop before training with the reason."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from e2e.test_run import _distill

from distill.config import ConfigError, RolloutConfig, resolve_config
from distill.engines import vllm
from distill.engines.compat import check_config, vllm_rollout_reason


def test_hf_is_the_default_and_keeps_trl_on_transformers_generate() -> None:
    rollout = RolloutConfig()
    assert rollout.engine == "hf"
    assert vllm.trainer_args(rollout) == {"use_vllm": False}


def test_colocate_and_server_modes_become_grpo_config_arguments(tmp_path: Path) -> None:
    from trl import GRPOConfig

    colocate = vllm.trainer_args(RolloutConfig(engine="vllm", vllm_gpu_memory_utilization=0.5))
    server = vllm.trainer_args(
        RolloutConfig(engine="vllm", vllm_mode="server", vllm_server_url="http://10.0.0.2:8000")
    )
    assert colocate["vllm_mode"] == "colocate" and "vllm_server_base_url" not in colocate
    # TRL's own config takes them as they are (no distill-side vLLM code).
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, bf16=False, **server
    )
    assert args.use_vllm and args.vllm_mode == "server"
    assert args.vllm_server_base_url == "http://10.0.0.2:8000"
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, bf16=False, **colocate
    )
    assert args.use_vllm and args.vllm_mode == "colocate" and args.vllm_gpu_memory_utilization == 0.5


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="rollout.vllm_server_url"):
        resolve_config("rlve", "opd", overrides=["rollout.engine=vllm", "rollout.vllm_mode=server"])
    with pytest.raises(ConfigError, match=r"rollout.engine=vllm .* \(not sft on rlve\)"):
        check_config(resolve_config("rlve", "sft", overrides=["rollout.engine=vllm"]))
    # A GPU config can be written and checked on a machine without vLLM.
    cfg = resolve_config("rlve", "opd", overrides=["rollout.engine=vllm"])
    assert vllm_rollout_reason(cfg, check_install=False) is None
    check_config(cfg)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_a_run_without_vllm_installed_fails_before_training(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    proc = _distill(["run", "--domain", "rlve", "--method", "opd", "rollout.engine=vllm"], ws)
    assert proc.returncode == 2
    assert "rollout.engine=vllm needs the vllm package" in proc.stderr
    # Refused before a run directory exists: nothing is left behind.
    assert not (ws / "runs").exists()
