"""Online multi-turn ROSE and OPD: one real Trainer step on real episodes of the simulator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distill.config import OPDMethod, ROSEMethod, RunConfig, Sampling
from distill.domains.sciworld import SciWorldDomain
from distill.domains.sciworld.config import SciWorldDomainConfig
from distill.domains.sciworld.pool import EnvPool
from distill.methods.context import RunContext
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import StepLog

pytestmark = pytest.mark.integration


def _context(tmp_path: Path, tiny_zoo: Any, sw_pool: EnvPool, method: Any) -> RunContext:
    from distill.engines.hf import HFEngine

    domain_cfg = SciWorldDomainConfig(tasks=["4-2"], train_size=2, eval_size=1, max_turns=2)
    config = RunConfig.model_validate(
        {
            "domain": domain_cfg.model_dump(),
            "method": method.model_dump(),
            "rollout": {"prompts_per_step": 2, "num_generations": 1, "max_new_tokens": 8},
            "optim": {"lr": 1e-2, "max_steps": 1},
            "checkpoint": {"every_steps": 0},
            "seed": 2,
        }
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return RunContext(
        config=config,
        run=RunDir(run_dir),
        domain=SciWorldDomain(domain_cfg, pool=sw_pool),
        student=HFEngine.load(str(tiny_zoo.student)),
        teacher=HFEngine.load(str(tiny_zoo.teacher)),
        log=StepLog(RunDir(run_dir), NullTracker()),
    )


@pytest.mark.parametrize("variant", ["rose", "opd", "opd-topk"])
def test_one_online_step(variant: str, tmp_path: Path, tiny_zoo: Any, sw_pool: EnvPool) -> None:
    import torch

    from distill.methods.episode_online import train

    name = variant.split("-")[0]
    methods = {
        "rose": ROSEMethod(student_turns=1, student_turns_min=None, teacher_max_tokens=8),
        "opd": OPDMethod(),
        "opd-topk": OPDMethod(loss="forward_kl_topk", top_k=5),
    }
    ctx = _context(tmp_path, tiny_zoo, sw_pool, methods[variant])
    before = [p.detach().clone() for p in ctx.student.model.parameters()]
    train(ctx)
    rows = [json.loads(line) for line in (ctx.run.path / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    for key in (
        "env/turns_mean",
        "env/student_turns_mean",
        "env/teacher_turns_mean",
        "env/invalid_action_rate",
        "env/score_mean",
        "env/success_rate",
        "env/step_time_s",
        "train/loss",
    ):
        assert key in last, key
    assert 0.0 <= last["student/stopped_rate"] <= 1.0  # turns ended at their action line
    if name == "rose":
        # the student plays turn 1, the teacher turn 2; CE on the teacher's turn
        assert last["env/student_turns_mean"] == 1 and last["env/teacher_turns_mean"] == 1
        assert "train/ce_loss" in last and "teacher/ce_target_tokens_mean" in last
    else:
        assert last["env/student_turns_mean"] == 2 and last["env/teacher_turns_mean"] == 0
        assert "kl/reverse_kl_mean" in last
        assert ("kl/topk_overlap" if variant == "opd-topk" else "kl/advantage_mean") in last
    samples = (ctx.run.path / "samples" / "step-1.jsonl").read_text().splitlines()
    assert len(samples) == 2 and json.loads(samples[0])["turns"] == 2
    after = list(ctx.student.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_cross_family_rose_bridges_turn_by_turn(tmp_path: Path, tiny_zoo: Any, sw_pool: EnvPool) -> None:
    """A llama-token teacher takes over qwen-token episodes through the tokenizer bridge: it reads
    them with each student turn's ids crossed to its own tokens, and its turn lands in the episode
    as the bridge's qwen ids of its own ids, labelled for CE; budgets count its llama tokens and
    the step logs teacher/seam_failure_rate."""
    from transformers import AutoTokenizer

    from distill.engines.hf import HFEngine
    from distill.episodes.data import BridgedAgent, episode_example
    from distill.episodes.episode import frame_for
    from distill.episodes.play import EngineAgent, handover, play
    from distill.methods.episode_online import train
    from distill.tokenizer_bridge.bridge import TokenizerBridge, trim_partial

    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.teacher_llama))
    llama = AutoTokenizer.from_pretrained(tiny_zoo.teacher_llama)
    assert student.tokenizer.get_vocab() != llama.get_vocab()
    domain = SciWorldDomain(
        SciWorldDomainConfig(tasks=["4-2"], train_size=2, eval_size=1, max_turns=3),
        pool=sw_pool,
    )
    items = domain.train_items()[:1]
    seen: list[str] = []
    bridge = TokenizerBridge(student.tokenizer, llama)
    bridged = BridgedAgent(EngineAgent(teacher, "teacher", Sampling(8)), domain.script, bridge)
    inner_act = bridged.agent.act

    def spy(views):  # type: ignore[no-untyped-def]  # a test double of EngineAgent.act
        seen.extend(llama.decode(v.ids[:3]) for v in views)
        return inner_act(views)

    bridged.agent.act = spy  # type: ignore[method-assign]  # a test double of EngineAgent.act
    policy = handover(EngineAgent(student, "student", Sampling(8)), bridged, 1)
    (ep,) = play(domain, items, policy, student.tokenizer, frame_for(student.tokenizer, None))
    assert [t.writer for t in ep.turns] == ["student", "teacher", "teacher"]
    assert len(seen) == 2 and all(s.startswith("<|begin_of_text|>") for s in seen)  # llama's own frame
    own = bridged.own[ep.uid]  # the teacher's own llama ids of each turn it wrote
    assert sorted(own) == [1, 2]
    for i, ((start, end, writer), turn) in enumerate(zip(ep.turn_spans(), ep.turns, strict=True)):
        assert writer == turn.writer
        if writer == "teacher":  # the teacher's ids, crossed into the student's
            kept = trim_partial(llama, own[i]) if turn.truncated else own[i]
            assert ep.ids[start:end] == bridge.to_student(kept).ids
            assert turn.source_tokens == len(own[i]) and turn.seam_ok
    assert ep.seam_ok and ep.record(domain)["seam_ok"] is True
    _, labels = episode_example(ep, ["teacher"])
    assert sum(label != -100 for label in labels) == sum(
        e - s for s, e, w in ep.turn_spans() if w == "teacher"
    )

    # And a whole cross-family ROSE step through the trainer (OPD stays refused).
    ctx = _context(
        tmp_path, tiny_zoo, sw_pool, ROSEMethod(student_turns=1, student_turns_min=None, teacher_max_tokens=8)
    )
    ctx.teacher = teacher
    train(ctx)
    last = [json.loads(line) for line in (ctx.run.path / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["env/teacher_turns_mean"] == 1 and "train/ce_loss" in last
    assert last["teacher/seam_failure_rate"] == 0.0  # the zoo pair's seams are lossless
    opd_dir = tmp_path / "opd"
    opd_dir.mkdir()
    opd = _context(opd_dir, tiny_zoo, sw_pool, OPDMethod())
    opd.teacher = teacher
    with pytest.raises(ValueError, match="must share a"):
        train(opd)
