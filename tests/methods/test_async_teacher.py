"""rollout.async_teacher through the real OPD trainer: the teacher in a worker process scores batch
i while the student generates batch i+1; each trained batch carries its own teacher scores. And
the pipeline's own scheduling: one queue a teacher, its time the sum of its domains'."""

from __future__ import annotations

import json
import math
import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from distill.config import ConfigError, OPDMethod, RunConfig, resolve_config
from distill.domains import build_domain
from distill.engines.compat import check_config
from distill.engines.hf import HFEngine
from distill.engines.worker import WorkerEngine
from distill.methods import opd
from distill.methods.async_teacher import AsyncTeacher
from distill.methods.batch import Batches, TeacherSide
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
        # As prepare.py loads it: with the async teacher its weights are in its worker only.
        teacher=WorkerEngine(str(tiny_zoo.teacher), threads=1, wait=False)
        if async_teacher
        else HFEngine.load(str(tiny_zoo.teacher)),
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
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)


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


class Clock:
    """Stands in for `Batches.score` (the pipeline calls nothing else of it): each domain's rows
    take `seconds[domain]`; it records how many calls are inside each teacher at once."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self.inside: dict[int, int] = {}
        self.most = 0
        self.lock = threading.Lock()

    def score(self, scorers: dict[str, Any], batch: Any) -> dict[str, Any]:
        out = {}
        for part, scorer in scorers.items():
            with self.lock:
                self.inside[id(scorer)] = self.inside.get(id(scorer), 0) + 1
                self.most = max(self.most, self.inside[id(scorer)])
            time.sleep(self.seconds[part])
            with self.lock:
                self.inside[id(scorer)] -= 1
            out[part] = (batch, self.seconds[part])
        return out


class Batch:
    def __init__(self, inputs: list[dict[str, Any]]) -> None:
        self.inputs = inputs


def test_several_teachers_score_side_by_side_each_its_domains_in_turn() -> None:
    """rlve and dapo share one teacher, gsm its own: each teacher's batches go through one queue
    (never two calls inside one teacher, also while the next batch is scored ahead), a step's
    teacher time is the slower teacher's sum over its domains, and what the step did not wait of
    it is the overlap."""
    shared, other = object(), object()
    sides = {
        "rlve": TeacherSide(shared, lambda e, i: []),  # type: ignore[arg-type]
        "dapo": TeacherSide(shared, lambda e, i: []),  # type: ignore[arg-type]
        "gsm": TeacherSide(other, lambda e, i: []),  # type: ignore[arg-type]
    }
    clock = Clock({"rlve": 0.4, "dapo": 0.4, "gsm": 0.05})
    pipeline = AsyncTeacher(sides)
    first, second = [{"i": 1}], [{"i": 2}]
    fetched = iter([([first], 1), ([second], 1), ([], 0)])
    try:
        assert pipeline.lookahead("epoch", lambda: next(fetched)) == ([first], 1)

        def finish(batch: Batch, scored: dict[str, Any], perf: dict[str, float]) -> dict[str, Any]:
            assert set(scored) == {"rlve", "dapo", "gsm"} and all(b is batch for b, _ in scored.values())
            return perf

        perf = pipeline.step(first, clock, Batch, finish, ahead=True)  # type: ignore[arg-type]
        # The first step waits for all of it: the shared teacher's two domains, one after the other
        # (the slowest single domain would be 0.4 s).
        assert perf["perf/teacher_time_s"] >= 0.8
        assert perf["perf/teacher_wait_s"] >= perf["perf/teacher_time_s"] - 1e-3
        assert pipeline.lookahead("epoch", lambda: next(fetched)) == ([second], 1)
        time.sleep(0.4)  # the trainer's step on batch 1, while the teachers score batch 2
        perf = pipeline.step(second, clock, Batch, finish, ahead=False)  # type: ignore[arg-type]
        # Batch 2 queued behind batch 1 at its teacher: its time is its own scoring (0.8 s), not
        # the queue's (1.6 s with it).
        assert 0.8 <= perf["perf/teacher_time_s"] < 1.3
        assert perf["perf/overlap_s"] == pytest.approx(
            perf["perf/teacher_time_s"] - perf["perf/teacher_wait_s"]
        )
        assert perf["perf/overlap_s"] >= 0.1
    finally:
        pipeline.close()
    assert clock.most == 1, "two calls inside one teacher at once"
