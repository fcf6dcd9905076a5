"""Which engines a run config can use: checked by whoever resolves a config, before a run exists.

The config validates names and fields on its own; whether an engine can serve a method on a
domain is the engines' knowledge, so it lives here, below the config's callers (the CLI, the
runner, the grid), never inside `distill.config`.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from distill import registry
from distill.config import ConfigError

if TYPE_CHECKING:
    from distill.config import RunConfig


def runs_on_grpo(config: RunConfig) -> bool:
    """Whether this run's student rollouts and loss go through TRL's GRPO trainer (the methods
    whose entry says `trl_rollout`, on single-turn domains; the episode methods have their own loop)."""
    entry = registry.method_entry(config.method.name)
    return entry.trl_rollout and not registry.domain_entry(config.domain.name).episodic


def _grpo_methods() -> str:
    return ", ".join(name for name, entry in registry.METHODS.items() if entry.trl_rollout)


def served_teacher_reason(config: RunConfig) -> str | None:
    """Why this run cannot use a teacher behind a server (it needs the teacher's weights in-process)."""
    method = config.method
    if registry.domain_entry(config.domain.name).episodic:
        return (
            f"the episode methods on {config.domain.name} score and continue turns with the teacher's "
            "weights in-process (use teacher.engine=hf)"
        )
    if registry.method_entry(method.name).own_teacher:
        return f"{method.name}'s teacher is the student's own weights; it cannot be served (use teacher.engine=hf)"
    if getattr(method, "loss", None) == "jsd":
        return (
            "method.loss=jsd needs the teacher's hidden states and full vocabulary head in-process; "
            "use forward_kl_topk (served top-k logprobs) or teacher.engine=hf"
        )
    return None


def vllm_rollout_reason(config: RunConfig, check_install: bool = True) -> str | None:
    """Why `rollout.engine=vllm` cannot run this config (None: it can). `check_install=False`
    skips the install check: a GPU config may be written on a machine without vLLM."""
    if config.rollout.engine != "vllm":
        return None
    if not runs_on_grpo(config):
        return (
            f"rollout.engine=vllm runs through TRL's GRPO trainer, which only {_grpo_methods()} "
            f"use (not {config.method.name} on {config.domain.name}); use rollout.engine=hf"
        )
    if check_install and importlib.util.find_spec("vllm") is None:
        return (
            "rollout.engine=vllm needs the vllm package in distill's own environment (a GPU machine: "
            "`pip install vllm`); use rollout.engine=hf on CPU, or serve the teacher with `distill serve teacher`"
        )
    return None


def async_teacher_reason(config: RunConfig) -> str | None:
    """Why `rollout.async_teacher=true` cannot run this config (None: it can)."""
    if not config.rollout.async_teacher:
        return None
    if (
        not registry.method_entry(config.method.name).async_teacher
        or registry.domain_entry(config.domain.name).episodic
    ):
        able = ", ".join(name for name, entry in registry.METHODS.items() if entry.async_teacher)
        return (
            f"rollout.async_teacher: only {able} on single-turn domains scores a separate teacher per step "
            f"(not {config.method.name} on {config.domain.name}); drop it"
        )
    if config.optim.grad_accum != 1:
        return (
            "rollout.async_teacher: needs optim.grad_accum=1 (one generation per optimizer step); "
            "set rollout.async_teacher=false to accumulate"
        )
    return None


def grpo_group_reason(config: RunConfig) -> str | None:
    """Why the rollout groups cannot run on TRL's GRPO trainer (None: they can)."""
    if runs_on_grpo(config) and config.rollout.num_generations < 2:
        return (
            f"rollout.num_generations={config.rollout.num_generations}: {config.method.name} on "
            f"{config.domain.name} runs on TRL's GRPO trainer, which samples at least 2 completions per "
            "prompt; set it to 2 or more"
        )
    return None


def check_config(config: RunConfig, check_install: bool = False) -> None:
    """Raise ConfigError (one line) when the config's engines cannot run it."""
    for part in registry.domain_parts(config.domain.name):
        if config.teacher_of(part).engine == "server" and (reason := served_teacher_reason(config)):
            field = f"teachers.{part}" if config.teachers else "teacher"
            raise ConfigError(f"{field}.engine=server: {reason}")
    reason = (
        vllm_rollout_reason(config, check_install)
        or async_teacher_reason(config)
        or grpo_group_reason(config)
    )
    if reason:
        raise ConfigError(reason)
