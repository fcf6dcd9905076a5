"""Multi-turn teacher-SFT: the teacher plays episodes; CE rows carry labels on its turns only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distill.config import RunConfig, SFTMethod
from distill.domains.sciworld import SciWorldDomain, item_of
from distill.domains.sciworld.config import SciWorldDomainConfig
from distill.domains.sciworld.index import IndexEntry
from distill.domains.sciworld.pool import EnvPool
from distill.episodes.data import IGNORE, episode_example, retokenize
from distill.episodes.episode import ChatFrame
from distill.episodes.play import handover, play
from distill.methods.context import RunContext
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import StepLog

from .conftest import gold

pytestmark = pytest.mark.integration


def test_teacher_sft_on_episodes(tmp_path: Path, tiny_zoo: Any, sw_pool: EnvPool) -> None:
    import torch

    from distill.engines.hf import HFEngine
    from distill.methods.episode_sft import train as train_sft

    domain_cfg = SciWorldDomainConfig(tasks=["4-2"], train_size=2, eval_size=1, max_turns=2)
    config = RunConfig.model_validate(
        {
            "domain": domain_cfg.model_dump(),
            "method": SFTMethod(keep_verified_only=False).model_dump(),
            "rollout": {"max_new_tokens": 8},
            "optim": {"lr": 1e-2, "max_steps": 1, "batch_size": 2},
            "checkpoint": {"every_steps": 0},
            "seed": 1,
        }
    )
    student = HFEngine.load(str(tiny_zoo.student))
    teacher = HFEngine.load(str(tiny_zoo.teacher))
    before = [p.detach().clone() for p in student.model.parameters()]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ctx = RunContext(
        config=config,
        run=RunDir(run_dir),
        domain=SciWorldDomain(domain_cfg, pool=sw_pool),
        student=student,
        teacher=teacher,
        log=StepLog(RunDir(run_dir), NullTracker()),
    )
    train_sft(ctx)

    rows = [
        json.loads(line) for line in (run_dir / "data" / "teacher_episodes.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 2
    for row in rows:
        assert row["turns"] == 2 and row["writers"] == ["teacher", "teacher"]
        labelled = [tok for tok, lab in zip(row["input_ids"], row["labels"], strict=True) if lab != IGNORE]
        assert labelled and len(labelled) < len(row["input_ids"])
        # every labelled token is the token itself (CE target), and the instruction is never labelled
        assert all(lab in (IGNORE, tok) for tok, lab in zip(row["input_ids"], row["labels"], strict=True))
        assert row["labels"][:50] == [IGNORE] * 50
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    merged = {k: v for m in metrics for k, v in m.items()}
    for key in (
        "env/turns_mean",
        "env/teacher_turns_mean",
        "env/invalid_action_rate",
        "env/score_mean",
        "env/success_rate",
        "env/step_time_s",
        "teacher/ce_target_tokens_mean",
        "teacher/truncation_rate",
        "train/ce_loss",
    ):
        assert key in merged, key
    assert merged["env/teacher_turns_mean"] == 2 and merged["env/student_turns_mean"] == 0
    after = list(ctx.student.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_retokenize_keeps_turns_and_writers(
    sw_domain: SciWorldDomain, tokenizer_dirs: dict[str, Path]
) -> None:
    """Cross-family data: an episode in qwen tokens, rebuilt turn by turn in llama tokens through
    the tokenizer bridge (each turn's ids cross, EOS by role), losslessly."""
    from transformers import AutoTokenizer

    from distill.tokenizer_bridge.bridge import TokenizerBridge

    qwen = AutoTokenizer.from_pretrained(tokenizer_dirs["qwen"])
    llama = AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])
    item = item_of(IndexEntry(index=4, task_id="4-2", task_name="find-non-living-thing", variation=4))
    policy = handover(gold("student"), gold("teacher"), 1)
    (ep,) = play(sw_domain, [item], policy, qwen, ChatFrame.of(qwen), gold=True)
    bridge = TokenizerBridge(qwen, llama)
    other = retokenize(ep, bridge, ChatFrame.of(llama), sw_domain.script, to_teacher=True)
    assert other.seam_ok and [t.source_tokens for t in other.turns] == [t.tokens for t in ep.turns]
    assert [w for _, _, w in other.turn_spans()] == [w for _, _, w in ep.turn_spans()]
    for (s1, e1, _), (s2, e2, _) in zip(ep.turn_spans(), other.turn_spans(), strict=True):
        assert qwen.decode(ep.ids[s1:e1], skip_special_tokens=True) == llama.decode(
            other.ids[s2:e2], skip_special_tokens=True
        )
        assert other.ids[e2 - 1] == llama.eos_token_id
    ids, labels = episode_example(other, ["teacher"])
    assert sum(lab != IGNORE for lab in labels) == sum(
        e - s for s, e, w in other.turn_spans() if w == "teacher"
    )
    assert llama.decode(ids).startswith("<|begin_of_text|><|start_header_id|>user")
