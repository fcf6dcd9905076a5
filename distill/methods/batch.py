"""The generation side of an on-policy step: rollouts -> the teacher's scores -> the targets.

At generation time the teacher scores the student's sampled ids (its logprobs, and its top-k or
hidden states where the loss needs them); that is all. The targets are the teacher's view in the
trainer's batch layout: its logprobs of the sampled ids (`teacher_logps`), its top-k
(`teacher_topk_*`) or hidden states (`teacher_hidden`), or, for a cross-family pair, the byte
groups (cross_family.py). The student's side is computed in the loss forward (signal.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from distill.config import OnPolicyKL
from distill.methods.cross_family import CrossFamily
from distill.methods.preflight import check_first_batch
from distill.methods.scoring import check_lengths, unpad_rows
from distill.methods.views import PromptFor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from distill.domains.base import Item
    from distill.engines.base import Engine, TokenScores
    from distill.methods.context import RunContext
    from distill.tokenizer_bridge.granularity import AlignedSample


class Scorer(Protocol):
    """What scores a batch for the teacher: its engine, or its worker process (async_teacher.py)."""

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        *,
        top_k: int = 0,
        states: bool = False,
    ) -> TokenScores: ...


@dataclass(frozen=True)
class TeacherSide:
    """A run's teacher as the on-policy step uses it: its engine, how it sees an item, and the
    cross-family groups when its tokenizer is not the student's (None: it scores the same ids)."""

    engine: Engine
    prompt_for: PromptFor
    cross: CrossFamily | None = None


@dataclass
class Rollouts:
    """One step's rollouts as GRPO produced them, with what the teacher needs to score them."""

    inputs: list[dict[str, Any]]
    out: dict[str, Any]
    items: list[Item]
    prompt_rows: list[list[int]]
    completion_rows: list[list[int]]
    teacher_prompts: list[list[int]]
    gen_time: float
    # Cross-family (cross_family.py): each completion in the teacher's tokens, with its byte groups.
    aligned: list[AlignedSample] | None = None

    @property
    def teacher_rows(self) -> list[list[int]]:
        """The completions as the teacher scores them: the student's own ids, or crossed ones."""
        return self.completion_rows if self.aligned is None else [s.teacher_ids for s in self.aligned]


class Batches:
    """Rollouts -> teacher scores -> targets for one run (the state: its teacher, and whether
    the first batch's preflight checks are still to run)."""

    def __init__(self, ctx: RunContext, teacher: TeacherSide) -> None:
        self.ctx = ctx
        self.method = ctx.method_as(OnPolicyKL)
        self.teacher = teacher
        self._check_first = ctx.config.preflight

    def rollouts(self, inputs: list[dict[str, Any]], out: dict[str, Any], gen_time: float) -> Rollouts:
        """GRPO's output for `inputs`, with the teacher's prompts (in its own chat template; for a
        cross-family pair its own tokens too) and, cross-family, the aligned samples."""
        items = [self.ctx.items[int(x["item_index"])] for x in inputs]
        completion_rows = unpad_rows(out["completion_ids"], out["completion_mask"])
        teacher, cross = self.teacher, self.teacher.cross
        return Rollouts(
            inputs,
            out,
            items,
            unpad_rows(out["prompt_ids"], out["prompt_mask"]),
            completion_rows,
            [teacher.prompt_for(teacher.engine, item) for item in items],
            gen_time,
            None if cross is None else cross.align(completion_rows),
        )

    def score(self, scorer: Scorer, batch: Rollouts) -> TokenScores:
        """The teacher's view of the sampled ids: its logprobs, and its top-k (forward_kl_topk) or
        hidden states (jsd) from the same pass: one teacher forward per step."""
        method = self.method
        if method.loss == "jsd":
            return scorer.score(batch.teacher_prompts, batch.teacher_rows, states=True)
        # Cross-family: the top-k also says what could extend each token (tokenizer_bridge/boundary.py).
        top_k = method.top_k if method.loss == "forward_kl_topk" or batch.aligned is not None else 0
        return scorer.score(batch.teacher_prompts, batch.teacher_rows, top_k=top_k)

    def targets(self, step: int, batch: Rollouts, teacher: TokenScores, perf: dict[str, float]) -> dict[str, Any]:
        """The teacher's view of the rollouts into the trainer's batch, the student's figures and
        samples. Advantages are set in the loss (signal.py); GRPO's own are zeroed."""
        ctx, out = self.ctx, batch.out
        mask_B_T = out["completion_mask"]
        out["advantages"] = torch.zeros_like(mask_B_T, dtype=torch.float32)
        cross = self.teacher.cross
        if cross is not None and batch.aligned is not None:
            targets, figures = cross.targets(batch.aligned, teacher, mask_B_T)
            out.update(targets)
            ctx.log.add(figures)
        else:
            teacher = teacher.widened(mask_B_T.shape[1])
            check_lengths(mask_B_T, teacher)
            out["teacher_logps"] = teacher.logprobs_B_T.to(mask_B_T.device)
            out.update(_divergence_targets(self.method, teacher, mask_B_T.device))
        if self._check_first:
            check_first_batch(ctx.student, out, batch.items, batch.prompt_rows, batch.completion_rows)
            self._check_first = False
        log_rollouts(ctx, step, batch.items, batch.prompt_rows, batch.completion_rows)
        ctx.log.add({"perf/gen_time_s": batch.gen_time, **perf})
        return out


def _divergence_targets(method: OnPolicyKL, teacher: TokenScores, device: torch.device) -> dict[str, torch.Tensor]:
    """What a divergence loss needs of the teacher beyond its sampled-token logprobs."""
    if method.loss == "forward_kl_topk":
        ids_B_T_K, logps_B_T_K = teacher.topk()
        return {"teacher_topk_ids": ids_B_T_K.to(device), "teacher_topk_logps": logps_B_T_K.to(device)}
    if method.loss == "jsd" and teacher.states_B_T_H is not None:
        return {"teacher_hidden": teacher.states_B_T_H.to(device)}
    return {}


def log_rollouts(
    ctx: RunContext,
    step: int,
    items: list[Item],
    prompt_rows: list[list[int]],
    completion_rows: list[list[int]],
) -> None:
    """The student's side of the step: lengths, truncation, reward, accuracy; a few samples."""
    texts = ctx.student.tokenizer.batch_decode(completion_rows, skip_special_tokens=True)
    eos = set(ctx.student.eos_ids)
    truncated = [not (row and row[-1] in eos) for row in completion_rows]
    scores = ctx.domain.score_batch(items, texts)
    lengths = [len(c) for c in completion_rows]
    ctx.log.add(
        {
            "student/completion_tokens_mean": sum(lengths) / len(lengths),
            "student/completion_tokens_max": float(max(lengths)),
            "student/truncation_rate": sum(truncated) / len(truncated),
            "student/reward_mean": sum(s.reward for s in scores) / len(scores),
            "student/accuracy": sum(s.correct for s in scores) / len(scores),
            "_tokens": float(sum(lengths) + sum(len(p) for p in prompt_rows)),
        }
    )
    rows = [
        {
            "prompt": items[i].prompt,
            "student": texts[i],
            "student_tokens": lengths[i],
            "truncated": truncated[i],
            "correct": scores[i].correct,
        }
        for i in range(min(ctx.config.tracking.sample_rows, len(items)))
    ]
    ctx.log.samples(step, rows)
