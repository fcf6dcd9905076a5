"""The generation side of an on-policy step: rollouts -> the teacher's scores -> the targets.

At generation time the teacher scores the student's sampled ids (its logprobs, and its top-k or
hidden states where the loss needs them); that is all. The targets are the teacher's view in the
trainer's batch layout: its logprobs of the sampled ids (`teacher_logps`), its top-k
(`teacher_topk_*`) or hidden states (`teacher_hidden`), or, for a cross-family pair, the byte
groups (cross_family.py). The student's side is computed in the loss forward (signal.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from distill.config import OnPolicyKL
from distill.domains.mixed import part_of
from distill.methods.cross_family import CrossFamily
from distill.methods.preflight import check_first_batch
from distill.methods.scoring import unpad_rows, vocab_rows
from distill.methods.targets import identity_groups, merged, same_family
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
    """One step's rollouts as GRPO produced them, with what the teachers need to score them."""

    inputs: list[dict[str, Any]]
    out: dict[str, Any]
    items: list[Item]
    prompt_rows: list[list[int]]
    completion_rows: list[list[int]]
    # Each row's domain (its teacher), and that teacher's prompt (in its own chat template).
    parts: list[str]
    teacher_prompts: list[list[int]]
    gen_time: float
    # Cross-family rows (cross_family.py): the completion in the teacher's tokens, with its byte
    # groups; None for a row its teacher scores in the student's own ids.
    aligned: list[AlignedSample | None]
    # The share of sampled ids outside the vocabulary (cut_out_of_vocab: masked from there on).
    out_of_vocab_rate: float = 0.0

    def rows_of(self, part: str) -> list[int]:
        return [i for i, p in enumerate(self.parts) if p == part]

    def teacher_row(self, i: int) -> list[int]:
        """Row i's completion as its teacher scores it: the student's own ids, or crossed ones."""
        sample = self.aligned[i]
        return self.completion_rows[i] if sample is None else sample.teacher_ids


class Batches:
    """Rollouts -> teacher scores -> targets for one run. Its state: a teacher per domain (one
    for a one-domain run), and whether the first batch's preflight checks are still to run."""

    def __init__(self, ctx: RunContext, teachers: dict[str, TeacherSide]) -> None:
        self.ctx = ctx
        self.method = ctx.method_as(OnPolicyKL)
        self.teachers = teachers
        self.parts = list(teachers)
        # One teacher of another family among several: every row in the group layout (targets.py).
        self.grouped = len(teachers) > 1 and any(t.cross is not None for t in teachers.values())
        self.student_rows = vocab_rows(ctx.student)
        self._check_first = ctx.config.preflight
        # A sampled id at or past this is masked (cut_out_of_vocab): the student's tokenizer must
        # decode it, and a teacher scoring the same ids must have a row for it.
        limits = [len(ctx.student.tokenizer)]
        limits += [vocab_rows(t.engine) for t in teachers.values() if t.cross is None]
        self.vocab_limit = min(limits)

    @property
    def cross(self) -> CrossFamily | None:
        """The groups' settings when the loss reads byte groups (any teacher crosses), else None."""
        crossing = [t.cross for t in self.teachers.values() if t.cross is not None]
        return crossing[0] if crossing else None

    def part_of(self, item: Item) -> str:
        return part_of(item) if len(self.parts) > 1 else self.parts[0]

    def rollouts(
        self, inputs: list[dict[str, Any]], out: dict[str, Any], gen_time: float, out_of_vocab_rate: float
    ) -> Rollouts:
        """GRPO's output for `inputs` (cut at ids outside the vocabulary), with each row's teacher
        prompt and, cross-family, its aligned sample."""
        items = [self.ctx.items[int(x["item_index"])] for x in inputs]
        completion_rows = unpad_rows(out["completion_ids"], out["completion_mask"])
        parts = [self.part_of(item) for item in items]
        aligned: list[AlignedSample | None] = [None] * len(items)
        for part, side in self.teachers.items():
            rows = [i for i, p in enumerate(parts) if p == part]
            if side.cross is not None and rows:
                for i, sample in zip(rows, side.cross.align([completion_rows[i] for i in rows]), strict=True):
                    aligned[i] = sample
        sides = [self.teachers[p] for p in parts]
        return Rollouts(
            inputs,
            out,
            items,
            unpad_rows(out["prompt_ids"], out["prompt_mask"]),
            completion_rows,
            parts,
            [side.prompt_for(side.engine, item) for side, item in zip(sides, items, strict=True)],
            gen_time,
            aligned,
            out_of_vocab_rate,
        )

    def score(self, scorers: dict[str, Scorer], batch: Rollouts) -> dict[str, tuple[TokenScores, float]]:
        """Each `scorers` domain's teacher's view of its rows' sampled ids, and its seconds: its
        logprobs, and its top-k (forward_kl_topk) or hidden states (jsd) from the same pass: one
        forward a teacher."""
        out: dict[str, tuple[TokenScores, float]] = {}
        for part in scorers:
            rows = batch.rows_of(part)
            if not rows:
                continue
            start = time.perf_counter()
            prompts = [batch.teacher_prompts[i] for i in rows]
            completions = [batch.teacher_row(i) for i in rows]
            if self.method.loss == "jsd":
                scores = scorers[part].score(prompts, completions, states=True)
            else:
                # Cross-family: the top-k also says what could extend each token (boundary.py).
                crossing = self.teachers[part].cross is not None
                top_k = self.method.top_k if self.method.loss == "forward_kl_topk" or crossing else 0
                scores = scorers[part].score(prompts, completions, top_k=top_k)
            out[part] = scores, time.perf_counter() - start
        return out

    def targets(
        self, step: int, batch: Rollouts, scored: dict[str, tuple[TokenScores, float]], perf: dict[str, float]
    ) -> dict[str, Any]:
        """The teachers' view of the rollouts into the trainer's batch, the student's figures and
        samples. Advantages are set in the loss (signal.py); GRPO's own are zeroed."""
        ctx, out = self.ctx, batch.out
        mask_B_T = out["completion_mask"]
        out["advantages"] = torch.zeros_like(mask_B_T, dtype=torch.float32)
        parts = [(part, batch.rows_of(part)) for part in self.parts if part in scored]
        each = [(rows, self._targets(part, batch, rows, scored[part][0], mask_B_T)) for part, rows in parts]
        out.update(each[0][1] if len(each) == 1 else merged(each, len(batch.parts)))
        if len(self.parts) > 1:
            out["domain_index"] = torch.tensor(
                [self.parts.index(p) for p in batch.parts], device=mask_B_T.device
            )
            perf = {**perf, **{f"perf/teacher_time_s/{p}": scored[p][1] for p, _ in parts}}
        if self._check_first:
            check_first_batch(ctx.student, out, batch.items, batch.prompt_rows, batch.completion_rows)
            self._check_first = False
        cut = out.pop("cut_B", None)  # not a tensor for the trainer: read here only
        log_rollouts(ctx, step, batch.items, batch.prompt_rows, batch.completion_rows, batch.parts, cut)
        ctx.log.add(
            {"perf/gen_time_s": batch.gen_time, "student/out_of_vocab_rate": batch.out_of_vocab_rate, **perf}
        )
        return out

    def _targets(
        self, part: str, batch: Rollouts, rows: list[int], teacher: TokenScores, mask_B_T: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """One teacher's targets for its rows (the batch's grid, those rows only)."""
        cross = self.teachers[part].cross
        mask_b_T = mask_B_T[torch.tensor(rows, dtype=torch.long, device=mask_B_T.device)]
        if cross is not None:
            samples = [batch.aligned[i] for i in rows]
            assert all(s is not None for s in samples), "a cross-family row is aligned at generation"
            targets, figures = cross.targets([s for s in samples if s is not None], teacher, mask_b_T)
            self.ctx.log.add(figures if len(self.parts) == 1 else per_part(figures, part))
            return targets
        if self.grouped:
            return identity_groups(self.method, teacher, mask_b_T, self.student_rows)
        return same_family(self.method, teacher, mask_b_T)


def per_part(figures: dict[str, float], part: str) -> dict[str, float]:
    """`kl/aligned_share` -> `kl/<part>/aligned_share`: one domain's figures in a mixed run."""
    out = {}
    for key, value in figures.items():
        head, _, tail = key.partition("/")
        out[f"{head}/{part}/{tail}" if tail else f"{key}/{part}"] = value
    return out


def cut_out_of_vocab(out: dict[str, Any], limit: int) -> tuple[int, int]:
    """Mask each completion from its first id at or past `limit` (a row of the student's head
    the tokenizer cannot decode, or the teacher cannot score) to its end: the loss and the
    teacher see the tokens before it only. Returns (such ids, completion tokens) of the batch."""
    ids_B_T, mask_B_T = out["completion_ids"], out["completion_mask"]
    outside_B_T = (ids_B_T >= limit) & mask_B_T.bool()
    outside, tokens = int(outside_B_T.sum()), int(mask_B_T.sum())
    if outside:
        after_B_T = outside_B_T.long().cumsum(dim=1) > 0
        out["completion_mask"] = mask_B_T * (~after_B_T).to(mask_B_T.dtype)
    # A cut row ends before its EOS without having reached the token budget: not a truncation.
    out["cut_B"] = outside_B_T.any(dim=1).tolist()
    return outside, tokens


def duplicate_share(prompt_rows: Sequence[Sequence[int]], completion_rows: Sequence[Sequence[int]]) -> float:
    """The share of sampled responses that repeat another sample of the same prompt id for id,
    each distinct response's first copy not counted: the samples a step spends on a response it
    already has (4 identical samples of a prompt: 3 of 4; near-greedy sampling, several a prompt)."""
    counts = Counter((tuple(p), tuple(c)) for p, c in zip(prompt_rows, completion_rows, strict=True))
    return sum(n - 1 for n in counts.values()) / max(len(completion_rows), 1)


def log_rollouts(
    ctx: RunContext,
    step: int,
    items: list[Item],
    prompt_rows: list[list[int]],
    completion_rows: list[list[int]],
    parts: list[str],
    cut: list[bool] | None = None,
) -> None:
    """The student's side of the step: lengths, truncation (`cut`: rows ended at an id outside
    the vocabulary, which are not), duplicates, reward, accuracy (per domain too in a mixed run); a few samples."""
    texts = ctx.student.tokenizer.batch_decode(completion_rows, skip_special_tokens=True)
    eos = set(ctx.student.eos_ids)
    cut = cut or [False] * len(completion_rows)
    truncated = [not (row and row[-1] in eos) and not c for row, c in zip(completion_rows, cut, strict=True)]
    scores = ctx.domain.score_batch(items, texts)
    lengths = [len(c) for c in completion_rows]
    figures = {
        "student/completion_tokens_mean": sum(lengths) / len(lengths),
        "student/completion_tokens_max": float(max(lengths)),
        "student/truncation_rate": sum(truncated) / len(truncated),
        "student/duplicate_share": duplicate_share(prompt_rows, completion_rows),
        "student/reward_mean": sum(s.reward for s in scores) / len(scores),
        "student/accuracy": sum(s.correct for s in scores) / len(scores),
        "_tokens": float(sum(lengths) + sum(len(p) for p in prompt_rows)),
        # The batch's padded sequence width, for the attention part of a step's FLOPs (perf/mfu).
        "_seq_len_max": float(max(lengths) + max(len(p) for p in prompt_rows)),
    }
    for part in sorted(set(parts)) if len(set(parts)) > 1 else []:
        mine = [s for s, p in zip(scores, parts, strict=True) if p == part]
        figures[f"student/{part}/accuracy"] = sum(s.correct for s in mine) / len(mine)
    ctx.log.add(figures)
    rows = [
        {
            "prompt": items[i].prompt,
            "student": texts[i],
            "student_tokens": lengths[i],
            "truncated": truncated[i],
            "correct": scores[i].correct,
            **({"domain": parts[i]} if len(set(parts)) > 1 else {}),
        }
        for i in range(min(ctx.config.tracking.sample_rows, len(items)))
    ]
    ctx.log.samples(step, rows)
