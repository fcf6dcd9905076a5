"""The on-policy batch (methods/batch.py): the cut at ids outside the vocabulary, and a batch whose
rows go to several teachers, one of another family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_runs import two_teachers_config

from distill.config import OPDMethod, Sampling
from distill.domains import build_domain
from distill.domains.mixed import part_of
from distill.engines.base import right_pad
from distill.engines.hf import HFEngine
from distill.methods.batch import Batches, TeacherSide, cut_out_of_vocab
from distill.methods.context import RunContext
from distill.methods.cross_family import CrossFamily
from distill.methods.signal import Signal
from distill.methods.views import plain_prompt
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import SilentLog


def test_a_row_is_masked_from_its_first_id_outside_the_vocabulary_on() -> None:
    out = {
        "completion_ids": torch.tensor([[5, 9, 3, 2], [5, 12, 3, 2], [1, 2, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]),
    }
    outside, tokens = cut_out_of_vocab(out, limit=10)
    assert (outside, tokens) == (1, 10)
    # Row 1 keeps the token before the id 12 only; the others are untouched.
    assert out["completion_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    # The cut row is marked, so it does not count as truncated (it never reached the budget).
    assert out["cut_B"] == [False, True, False]


def test_an_id_under_padding_is_not_an_outside_id() -> None:
    out = {"completion_ids": torch.tensor([[1, 99]]), "completion_mask": torch.tensor([[1, 0]])}
    assert cut_out_of_vocab(out, limit=10) == (0, 1)
    assert out["completion_mask"].tolist() == [[1, 0]] and out["cut_B"] == [False]


# ---------------------------------------------------------------- several teachers in one batch


def _mixed_run(tiny_zoo: Any, tmp_path: Path) -> tuple[RunContext, dict[str, TeacherSide]]:
    """A run over rlve and dapo: rlve's teacher of the student's family, dapo's of another."""
    config = two_teachers_config(
        tiny_zoo,
        "domain.train_size=16",
        "domain.parts.rlve.train_size=8",
        "domain.parts.dapo.train_size=8",
        "method.top_k=6",
        "preflight=false",
    )
    method = config.method
    assert isinstance(method, OPDMethod)
    student = HFEngine.load(str(tiny_zoo.student))
    engines = {
        "rlve": HFEngine.load(str(tiny_zoo.teacher)),
        "dapo": HFEngine.load(str(tiny_zoo.teacher_llama)),
    }
    ctx = RunContext(
        config,
        RunDir(tmp_path),
        build_domain(config.domain),
        student,
        engines["rlve"],
        SilentLog(NullTracker()),
    )
    ctx.teachers = dict(engines)
    ctx.items = ctx.domain.train_items()
    crossing = CrossFamily(student.tokenizer, engines["dapo"].tokenizer, method)
    sides = {
        "rlve": TeacherSide(engines["rlve"], plain_prompt),
        "dapo": TeacherSide(engines["dapo"], plain_prompt, crossing),
    }
    return ctx, sides


def _grpo_out(ctx: RunContext, indices: list[int]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The student's greedy completions of `indices` in the layout GRPO hands the step."""
    student = ctx.student
    prompts = [student.prompt_ids(ctx.items[i].prompt) for i in indices]
    completions = [c.ids for c in student.generate(prompts, Sampling(10))]
    prompt_ids, prompt_mask = student.left_pad(prompts)
    completion_ids, completion_mask = right_pad(completions, int(student.tokenizer.pad_token_id))
    out = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
    }
    return [{"item_index": i} for i in indices], out


@pytest.mark.integration
def test_a_batch_of_two_teachers_one_crossing_scores_each_domain_as_its_own_run(
    tiny_zoo: Any, tmp_path: Path
) -> None:
    """Each row goes to its domain's teacher; the batch holds every row as byte groups (rlve's one
    group a token, dapo's through the bridge), `domain_index` says whose each row is, and the
    per-domain meters give each domain what a batch of its rows alone gives."""
    ctx, sides = _mixed_run(tiny_zoo, tmp_path)
    parts = [part_of(item) for item in ctx.items]
    picked = [parts.index("rlve"), parts.index("dapo"), len(parts) - 1 - parts[::-1].index("rlve")]
    batches = Batches(ctx, sides)
    assert batches.grouped and batches.cross is sides["dapo"].cross
    inputs, out = _grpo_out(ctx, picked)
    sampled = dict(out)  # the step adds its targets to `out`
    batch = batches.rollouts(inputs, out, 0.0, 0.0)
    assert batch.parts == ["rlve", "dapo", "rlve"] and batch.rows_of("rlve") == [0, 2]
    assert batch.aligned[0] is None and batch.aligned[1] is not None  # only dapo's row crosses
    scored = batches.score({p: s.engine for p, s in sides.items()}, batch)
    merged_out = batches.targets(1, batch, scored, {})
    assert merged_out["domain_index"].tolist() == [0, 1, 0]
    assert {"xf_group", "xf_weight", "teacher_topk_ids"} <= set(merged_out)
    logged = ctx.log.pending  # type: ignore[attr-defined]
    assert {"perf/teacher_time_s/rlve", "perf/teacher_time_s/dapo", "kl/dapo/aligned_share"} <= set(logged)
    assert "kl/rlve/aligned_share" not in logged and "kl/aligned_share" not in logged
    method = ctx.method_as(OPDMethod)
    signal = Signal(method, SilentLog(NullTracker()), batches.cross, None, list(sides))
    signal.divergence_loss(1, ctx.student.model, ctx.student.model, merged_out)
    figures = signal.log.pending  # type: ignore[attr-defined]
    # Each domain alone: rlve's rows through the same-family path, dapo's through its bridge.
    for part, cross in (("rlve", None), ("dapo", sides["dapo"].cross)):
        rows = batch.rows_of(part)
        one_inputs = [inputs[i] for i in rows]
        one_out = {key: value[rows] for key, value in sampled.items()}  # the same rows
        single = Batches(ctx, {part: sides[part]})
        one = single.rollouts(one_inputs, one_out, 0.0, 0.0)
        one_batch = single.targets(1, one, single.score({part: sides[part].engine}, one), {})
        own = Signal(method, SilentLog(NullTracker()), cross)
        own.divergence_loss(1, ctx.student.model, ctx.student.model, one_batch)
        for key in ("reverse_kl_mean", "reverse_kl_std", "advantage_mean"):
            assert figures[f"kl/{part}/{key}"] == pytest.approx(own.log.pending[f"kl/{key}"], abs=1e-5), (
                part,
                key,
            )  # type: ignore[attr-defined]
