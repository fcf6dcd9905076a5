"""rollout.async_teacher through the real OPD trainer: the teacher in a worker process scores batch
i while the student generates batch i+1; each trained batch carries its own teacher scores."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path
from typing import Any

import pytest
import torch

from distill.config import ConfigError, OPDMethod, RunConfig, resolve_config
from distill.domains import build_domain
from distill.engines.compat import check_config
from distill.engines.hf import HFEngine
from distill.methods import opd
from distill.methods.batch import Batches
from distill.methods.context import RunContext
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import StepLog

pytestmark = pytest.mark.integration
TARGETS = Batches.targets  # the real one (each run below wraps it afresh)


def _train(
    tmp_path: Path, tiny_zoo: Any, async_teacher: bool, loss: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Any], Path]:
    """Train 4 steps; returns what each trained batch held: (item prompts, completions,
    teacher prompts, the teacher scores it trained with)."""
    config = RunConfig.model_validate(
        {
            "domain": tiny_zoo.domain.model_dump(),
            "method": OPDMethod(loss=loss, top_k=4).model_dump(),
            "rollout": {
                "prompts_per_step": 2,
                "num_generations": 2,
                "max_new_tokens": 12,
                "async_teacher": async_teacher,
            },
            "optim": {"lr": 1e-3, "max_steps": 4},
            "checkpoint": {"every_steps": 0},
            "preflight": False,
            "seed": 5,
        }
    )
    run_dir = tmp_path / ("async" if async_teacher else "sync")
    run_dir.mkdir()
    ctx = RunContext(
        config=config,
        run=RunDir(run_dir),
        domain=build_domain(config.domain),
        student=HFEngine.load(str(tiny_zoo.student)),
        teacher=HFEngine.load(str(tiny_zoo.teacher)),
        log=StepLog(RunDir(run_dir), NullTracker()),
    )
    seen: list[Any] = []

    def capture(self: Batches, step: int, batch: Any, teacher: Any, perf: dict[str, float]) -> dict[str, Any]:
        (scores, _seconds) = teacher[ctx.config.domain.name]  # one domain: one teacher's scores
        seen.append(([i.prompt for i in batch.items], batch.completion_rows, batch.teacher_prompts, scores))
        return TARGETS(self, step, batch, teacher, perf)

    monkeypatch.setattr(Batches, "targets", capture)
    opd.train(ctx)
    return seen, run_dir


def test_async_teacher_scores_each_batch_it_trains(
    tiny_zoo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sync, _ = _train(tmp_path, tiny_zoo, False, "forward_kl_topk", monkeypatch)
    trained, run_dir = _train(tmp_path, tiny_zoo, True, "forward_kl_topk", monkeypatch)
    assert not multiprocessing.active_children(), "the teacher worker outlived the run"
    # The same prompts in the same order as the synchronous run: the lookahead takes the next
    # step's batch early, it does not skip or repeat one.
    assert [prompts for prompts, *_ in trained] == [prompts for prompts, *_ in sync]
    assert len(trained) == 4
    # Each trained batch's teacher scores are the teacher's view of exactly its sampled tokens.
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    for _, completions, teacher_prompts, scores in trained:
        expected = teacher.score(teacher_prompts, completions, top_k=4)
        assert scores.lengths() == [len(c) for c in completions]
        torch.testing.assert_close(scores.logprobs_B_T, expected.logprobs_B_T, atol=1e-5, rtol=0)
        torch.testing.assert_close(scores.topk()[1], expected.topk()[1], atol=1e-5, rtol=0)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/teacher_wait_s" in r]
    assert len(steps) == 4
    for r in steps:
        assert r["perf/overlap_s"] + r["perf/teacher_wait_s"] >= r["perf/teacher_time_s"] - 1e-6
        assert 0 <= r["perf/overlap_s"] <= r["perf/teacher_time_s"]


def test_async_teacher_jsd_gets_hidden_states_from_the_worker(
    tiny_zoo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained, run_dir = _train(tmp_path, tiny_zoo, True, "jsd", monkeypatch)
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    for _, completions, teacher_prompts, scores in trained:
        expected = teacher.score(teacher_prompts, completions, states=True)
        assert scores.states_B_T_H is not None and expected.states_B_T_H is not None
        torch.testing.assert_close(scores.states_B_T_H, expected.states_B_T_H, atol=1e-5, rtol=0)
    losses = [
        json.loads(line).get("train/loss") for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert all(loss is not None and loss == loss for loss in losses if loss is not None)


@pytest.mark.parametrize(
    ("method", "overrides", "needle"),
    [
        ("opsd", [], "only opd"),
        ("rose", [], "only opd"),
        ("opd", ["optim.grad_accum=2"], "grad_accum=1"),
    ],
)
def test_async_teacher_refused_where_it_cannot_run(method: str, overrides: list[str], needle: str) -> None:
    config = resolve_config("rlve", method, overrides=["rollout.async_teacher=true", *overrides])
    with pytest.raises(ConfigError, match=needle):
        check_config(config)


def test_async_teacher_refused_on_episodes() -> None:
    config = resolve_config("sciworld", "opd", overrides=["rollout.async_teacher=true"])
    with pytest.raises(ConfigError, match="single-turn"):
        check_config(config)
