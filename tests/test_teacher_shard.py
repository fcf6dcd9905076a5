"""`teacher.shard=true` is refused, in one line naming the field, wherever a sharded teacher could
not run in step on every rank; the runs it can go (FSDP2 / ZeRO-3 OPD scoring) are compared with
one process in tests/e2e/test_accelerate.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distill import teacher_shard
from distill.config import resolve_config

# What a run with a sharded teacher must set besides it (the rlve preset scores asynchronously).
RUNNABLE = ["teacher.shard=true", "rollout.async_teacher=false", "eval.eval_teacher=false"]


def _refusal(strategy: str, *overrides: str, domain: str = "rlve", method: str = "opd") -> str | None:
    return teacher_shard.refusal(resolve_config(domain, method, None, [*RUNNABLE, *overrides]), strategy)


def test_opd_scoring_shards_under_fsdp2_and_zero3() -> None:
    for strategy in ("fsdp", "zero3"):
        for loss in ("forward_kl_topk", "jsd", "k1", "k3", "token_reward_direct"):
            assert _refusal(strategy, f"method.loss={loss}") is None
    unsharded = resolve_config("rlve", "sft", None, [])
    assert teacher_shard.refusal(unsharded, "single") is None  # nothing asked: nothing refused


@pytest.mark.parametrize(
    ("strategy", "overrides", "start"),
    [
        ("single", [], "teacher.shard=true splits the teacher over the processes of an FSDP2 or ZeRO-3"),
        ("ddp", [], "teacher.shard=true splits the teacher"),
        ("deepspeed", [], "teacher.shard=true splits the teacher"),
        (
            "fsdp",
            ["teacher.engine=server", "teacher.url=http://127.0.0.1:8000"],
            "teacher.shard=true: teacher.engine=server",
        ),
        ("fsdp", ["rollout.async_teacher=true"], "teacher.shard=true: rollout.async_teacher"),
        ("zero3", ["eval.eval_teacher=true"], "teacher.shard=true: rank 0 evaluates the teacher alone"),
    ],
)
def test_launches_and_settings_a_sharded_teacher_cannot_run_under(
    strategy: str, overrides: list[str], start: str
) -> None:
    line = _refusal(strategy, *overrides)
    assert line is not None and line.startswith(start) and "\\n" not in line


@pytest.mark.parametrize(
    ("method", "domain", "start"),
    [
        ("sft", "rlve", "teacher.shard=true: method sft generates with the teacher"),
        ("rose", "rlve", "teacher.shard=true: method rose generates with the teacher"),
        ("opd", "sciworld", "teacher.shard=true: on the episodic domain sciworld"),
    ],
)
def test_methods_whose_teacher_works_rank_by_rank_are_refused(method: str, domain: str, start: str) -> None:
    assert str(_refusal("fsdp", domain=domain, method=method)).startswith(start)


def test_a_teacher_of_a_run_over_several_domains_is_named() -> None:
    config = resolve_config(
        "rlve+dapo",
        "opd",
        None,
        ["teachers.rlve.name=zoo:teacher", "teachers.dapo.name=zoo:teacher", "teachers.dapo.shard=true"],
    )
    assert str(teacher_shard.refusal(config, "fsdp")).startswith(
        "teachers.dapo.shard=true: a run over several domains"
    )


@pytest.mark.parametrize(
    "launch",
    [[], ["--launcher", "accelerate", "--accelerate-config", "configs/accelerate/cpu-ddp.yaml"]],
    ids=["one-process", "ddp"],
)
def test_the_cli_refuses_before_a_run_exists(tmp_path: Path, launch: list[str]) -> None:
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "distill", "run", "--domain", "rlve", "--method", "opd", *RUNNABLE, *launch],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**__import__("os").environ, "DISTILL_WORKSPACE": str(tmp_path / "ws")},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: teacher.shard=true splits the teacher"), (
        proc.stderr
    )
    assert not (tmp_path / "ws" / "runs").exists()
