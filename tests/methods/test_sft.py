"""Teacher-SFT's budget accounting on its trajectories (the same figures ROSE logs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distill.config import RunConfig, SFTMethod
from distill.domains import build_domain
from distill.engines.hf import HFEngine
from distill.methods.context import RunContext
from distill.methods.sft import check_budget, write_trajectories
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import StepLog


def _context(tmp_path: Path, tiny_zoo: Any, budget: int, keep_verified_only: bool) -> RunContext:
    config = RunConfig.model_validate(
        {
            "domain": tiny_zoo.domain.model_dump(),
            "method": SFTMethod(keep_verified_only=keep_verified_only).model_dump(),
            "rollout": {"max_new_tokens": budget},
            "optim": {"max_steps": 1, "batch_size": 6},
        }
    )
    run_dir = tmp_path / f"run-{budget}"
    run_dir.mkdir()
    engine = HFEngine.load(str(tiny_zoo.teacher))
    return RunContext(
        config=config,
        run=RunDir(run_dir),
        domain=build_domain(config.domain),
        student=engine,
        teacher=engine,
        log=StepLog(RunDir(run_dir), NullTracker()),
    )


def _logged(ctx: RunContext) -> dict[str, float]:
    return json.loads((ctx.run.path / "metrics.jsonl").read_text().splitlines()[0])


def test_truncated_teacher_is_counted_and_named_in_the_error(tmp_path: Path, tiny_zoo: Any) -> None:
    ctx = _context(tmp_path, tiny_zoo, budget=3, keep_verified_only=True)
    rows = write_trajectories(ctx)
    assert len(rows) == 6 and all(r["truncated"] and r["tokens"] == 3 for r in rows)
    with pytest.raises(ValueError, match=r"6 of 6 ended at rollout.max_new_tokens=3 without EOS"):
        check_budget(ctx, rows, [])
    # Logged before the run stops: this is the evidence diagnose reads.
    logged = _logged(ctx)
    assert logged["step"] == 0
    assert logged["teacher/ce_target_share"] >= 0.94 and logged["teacher/truncation_rate"] >= 0.9
    assert logged["teacher/ce_target_tokens_max"] == 3
    samples = (ctx.run.path / "samples" / "step-0.jsonl").read_text().splitlines()
    assert json.loads(samples[0])["truncated"] is True


def test_teacher_that_finishes_uses_a_small_share(tmp_path: Path, tiny_zoo: Any) -> None:
    ctx = _context(tmp_path, tiny_zoo, budget=64, keep_verified_only=False)
    eos = ctx.teacher.tokenizer.eos_token_id
    calls = {"n": 0}

    def stop_at_8(module: Any, args: Any, output: Any) -> Any:
        calls["n"] += 1
        if calls["n"] < 8:
            return output
        output = output.clone()
        output[..., eos] += 1e4
        return output

    ctx.teacher.model.lm_head.register_forward_hook(stop_at_8)
    rows = write_trajectories(ctx)
    check_budget(ctx, rows, rows)
    logged = _logged(ctx)
    assert logged["teacher/truncation_rate"] == 0.0
    assert logged["teacher/ce_target_tokens_mean"] == 8
    assert logged["teacher/ce_target_share"] == pytest.approx(8 / 64)
