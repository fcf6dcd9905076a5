"""ROSE, online and single-turn: the student starts, the teacher finishes, CE on the teacher's part.

Every step, for fresh prompts, the *current* student writes its response; it is cut after K
tokens (mask 0); the teacher continues from that state inside the same assistant turn (no new
turn, no second `<think>`) for at most t tokens (mask 1); the student takes one optimizer step of
cross-entropy on the teacher's tokens only. The student learns "from where I got to, this is how
the teacher goes on".

The update runs on the online trainer the episode methods share (online.py): a batch of prompt
indices becomes this step's ROSE batch inside `training_step`.

When the student's and teacher's tokenizers differ the prefix crosses through the tokenizer
bridge (ids -> text -> teacher ids, and back), with every seam checked; budgets are counted in
the teacher's tokens, coverage in the student's.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from distill.config import ROSEMethod
from distill.kernels.sharded import full_weights
from distill.methods.budget import student_completions, supervised_share, teacher_budget
from distill.methods.context import RunContext
from distill.methods.online import IGNORE, CECallback, OnlineTrainer, run_online
from distill.methods.pair import bridge_problem
from distill.tokenizer_bridge import thinking
from distill.tokenizer_bridge.bridge import TokenizerBridge, clean_cut, readable, trim_partial

if TYPE_CHECKING:
    import torch

    from distill.domains.base import Item
    from distill.engines.hf import HFEngine


@dataclass
class Rollout:
    """One student sample, cut and continued by the teacher."""

    item: Item
    prompt_ids: list[int]  # the student's chat prompt
    response_ids: list[int]  # the student's full response, EOS included when it emitted one
    response_truncated: bool
    response_text: str
    prefix_ids: list[int]  # the kept student tokens (mask 0)
    prefix_text: str = ""
    teacher_ids: list[int] = field(default_factory=list)  # continuation in teacher tokens (budget unit)
    teacher_truncated: bool = False
    target_ids: list[int] = field(default_factory=list)  # continuation in student tokens (mask 1)
    continuation_text: str = ""
    seam_ok: bool = True
    teacher_prefix_ids: list[int] = field(default_factory=list)  # the prefix in teacher tokens
    # The seam crossed through an anchor (tokenizer_bridge/anchor.py): read or written alone, a run
    # would have gained or lost a space (a sentencepiece `▁word` after the prefix).
    anchored: bool = False


def draw_prefix_len(method: ROSEMethod, n_content: int, rng: random.Random) -> int:
    """K for one sample: fixed, drawn from a range, or a fraction of the student's response,
    never past the response's own content (a student that stopped early is cut where it stopped)."""
    if method.prefix_fraction is not None:
        return min(n_content, round(method.prefix_fraction * n_content))
    if method.prefix_tokens_min is None:
        return min(n_content, method.prefix_tokens)
    high = min(method.prefix_tokens, n_content)
    return high if method.prefix_tokens_min >= high else rng.randint(method.prefix_tokens_min, high)


def rose_example(
    prompt_ids: list[int], prefix_ids: list[int], target_ids: list[int]
) -> tuple[list[int], list[int]]:
    """input_ids and labels of one sample: the loss sees the teacher's tokens only."""
    ids = list(prompt_ids) + list(prefix_ids) + list(target_ids)
    labels = [IGNORE] * (len(prompt_ids) + len(prefix_ids)) + list(target_ids)
    return ids, labels


def student_rollouts(
    ctx: RunContext, engine: HFEngine, bridge: TokenizerBridge, items: list[Item], rngs: list[random.Random]
) -> list[Rollout]:
    """The live student's full responses (for coverage and K-by-fraction), each cut at its K
    (drawn from its own stream in `rngs`)."""
    cfg = ctx.config
    method = ctx.method_as(ROSEMethod)
    prompts = [ctx.student.prompt_ids(item.prompt) for item in items]
    completions = engine.generate(prompts, cfg.rollout.sampling(), batch_size=cfg.eval.batch_size)
    eos = ctx.student.eos_ids
    # An id past the tokenizer (rows beyond it: Qwen3's 151,936 for 151,669 tokens) cannot be
    # decoded or bridged: the response is cut before it.
    limit = len(ctx.student.tokenizer)
    rollouts = []
    for item, prompt, comp, rng in zip(items, prompts, completions, rngs, strict=True):
        content = comp.ids[:-1] if comp.ids and comp.ids[-1] in eos else comp.ids
        content = next((content[:i] for i, tok in enumerate(content) if tok >= limit), content)
        k = draw_prefix_len(method, len(content), rng)
        if not bridge.same:
            # A byte-level token can end inside a character: cut at the character boundary.
            k = clean_cut(bridge.student, content, k)
        prefix = list(content[:k])
        rollouts.append(
            Rollout(
                item=item,
                prompt_ids=prompt,
                response_ids=list(comp.ids),
                response_truncated=comp.truncated,
                response_text=comp.text,
                prefix_ids=prefix,
                prefix_text=readable(bridge.student_pieces(prefix)),
            )
        )
    return rollouts


def teacher_continuations(ctx: RunContext, bridge: TokenizerBridge, rollouts: list[Rollout]) -> None:
    """The teacher continues each prefix in the same assistant turn for at most t tokens."""
    teacher = ctx.teacher
    rows: list[list[int]] = []
    for r in rollouts:
        if bridge.same:
            r.teacher_prefix_ids = list(r.prefix_ids)
        else:
            crossed = bridge.to_teacher(r.prefix_ids)
            r.seam_ok, r.anchored, r.teacher_prefix_ids = crossed.lossless, crossed.anchored, crossed.ids
        rows.append(thinking.teacher_prompt_ids(teacher, r.item.prompt, r.prefix_text) + r.teacher_prefix_ids)
    # A prefix that already holds a think block: the teacher may not open another one.
    suppress = thinking.think_open_ids(teacher.tokenizer)
    groups = {
        flag: [i for i, r in enumerate(rollouts) if thinking.has_think(r.prefix_text) == flag]
        for flag in (False, True)
    }
    for flag, indices in groups.items():
        if not indices:
            continue
        completions = teacher.generate(
            [rows[i] for i in indices],
            ctx.config.teacher_sampling(),
            batch_size=ctx.config.eval.batch_size,
            suppress_tokens=suppress if flag else [],
        )
        for i, comp in zip(indices, completions, strict=True):
            r = rollouts[i]
            r.teacher_ids, r.teacher_truncated = list(comp.ids), comp.truncated
            if bridge.same:
                r.target_ids = list(comp.ids)
                r.continuation_text = readable(bridge.student_pieces(comp.ids))
                continue
            kept = trim_partial(bridge.teacher, comp.ids) if comp.truncated else comp.ids
            # Read after the teacher's prefix and written after the student's: the continuation's
            # first token may carry the space between them.
            back = bridge.to_student(kept, after=(r.teacher_prefix_ids, r.prefix_ids))
            r.target_ids, r.continuation_text = back.ids, back.text
            r.anchored = r.anchored or back.anchored
            joined = bridge.student_pieces(r.prefix_ids + back.ids)
            r.seam_ok = (
                r.seam_ok
                and back.lossless
                and readable(joined) == r.prefix_text + back.text
                and not thinking.reopened(r.prefix_text, back.text)
            )


def step_metrics(rollouts: list[Rollout], method: ROSEMethod, bridged: bool) -> dict[str, float]:
    """The DESIGN.md per-step figures of ROSE over this step's samples."""
    trained = [r for r in rollouts if r.seam_ok]
    out = {
        **teacher_budget(
            [len(r.teacher_ids) for r in rollouts],
            [r.teacher_truncated for r in rollouts],
            method.teacher_max_tokens,
        ),
        **student_completions(
            [len(r.response_ids) for r in rollouts], [r.response_truncated for r in rollouts]
        ),
        "student/prefix_tokens_mean": sum(len(r.prefix_ids) for r in rollouts) / len(rollouts),
        "coverage/supervised_share": supervised_share(
            [len(r.target_ids) for r in trained], [len(r.response_ids) for r in rollouts]
        ),
    }
    if bridged:
        out["teacher/seam_failure_rate"] = 1 - len(trained) / len(rollouts)
        # Samples whose seam crossed losslessly only through an anchor (alone, it would have failed).
        out["bridge/anchor_rescue_rate"] = sum(r.anchored for r in trained) / len(rollouts)
    return out


def sample_rows(ctx: RunContext, rollouts: list[Rollout], n: int) -> list[dict[str, Any]]:
    """What samples/step-N.jsonl shows: prompt, student prefix, teacher continuation, mask."""
    shown = rollouts[:n]
    items = [r.item for r in shown]
    own = ctx.domain.score_batch(items, [r.response_text for r in shown])
    spliced = ctx.domain.score_batch(items, [r.prefix_text + r.continuation_text for r in shown])
    return [
        {
            "prompt": r.item.prompt,
            "student": r.response_text,  # the student's own full response (for coverage)
            "student_prefix": r.prefix_text,
            "teacher_continuation": r.continuation_text,
            # Over the trained response (student tokens): 0 = student prefix, 1 = CE target.
            "mask": [0] * len(r.prefix_ids) + [1] * (len(r.target_ids) if r.seam_ok else 0),
            "prefix_tokens": len(r.prefix_ids),
            "teacher_tokens": len(r.teacher_ids),
            "target_student_tokens": len(r.target_ids),
            "student_full_tokens": len(r.response_ids),
            "teacher_truncated": r.teacher_truncated,
            "student_truncated": r.response_truncated,
            "seam_ok": r.seam_ok,
            "student_correct": mine.correct,
            "continued_correct": theirs.correct,  # student prefix + teacher continuation
        }
        for r, mine, theirs in zip(shown, own, spliced, strict=True)
    ]


class ROSETrainer(OnlineTrainer):
    """Each micro-batch: the live student's rollouts, cut and continued by the teacher; CE on
    the teacher's tokens."""

    def __init__(self, ctx: RunContext, bridge: TokenizerBridge, **kwargs: Any) -> None:
        self.bridge = bridge
        # The optimizer step's rollouts and seconds so far (over its micro-batches).
        self._acc: list[Rollout] = []
        self._times: dict[str, float] = {}
        super().__init__(ctx, **kwargs)

    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        ctx = self.distill_ctx
        cfg = ctx.config
        step = self.state.global_step
        if self.begin_micro_batch():
            self._acc = []
            self._times = {"perf/gen_time_s": 0.0, "perf/teacher_time_s": 0.0, "perf/train_time_s": 0.0}
        batch_items = self.step_items(inputs)
        engine = self.live_engine()
        t0 = time.perf_counter()
        engine.model.eval()  # Trainer.training_step switches it back to train mode
        # A sharded student is whole on every rank for its rollouts (kernels/sharded.py).
        with full_weights(engine.model):
            rollouts = student_rollouts(
                ctx, engine, self.bridge, batch_items, self.sample_rngs(len(batch_items))
            )
        t1 = time.perf_counter()
        teacher_continuations(ctx, self.bridge, rollouts)
        t2 = time.perf_counter()
        if not any(r.seam_ok and r.target_ids for r in rollouts):
            raise ValueError(
                f"rose: no sample of step {step + 1} crossed the tokenizer bridge losslessly "
                f"(`distill bridge check --student {cfg.student.name} --teacher {cfg.teacher.name}`)"
            )
        examples = [
            rose_example(r.prompt_ids, r.prefix_ids, r.target_ids if r.seam_ok else []) for r in rollouts
        ]
        loss = self.ce_step(model, examples)
        t3 = time.perf_counter()
        self._acc.extend(rollouts)
        for key, seconds in zip(self._times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            self._times[key] += seconds
        ctx.log.add(
            {
                **step_metrics(self._acc, ctx.method_as(ROSEMethod), bridged=not self.bridge.same),
                **self._times,
                "student/accuracy": _accuracy(ctx, self._acc),
                "_tokens": float(sum(len(ids) for ids, _ in examples)),
            }
        )
        ctx.log.samples(step + 1, sample_rows(ctx, self._acc, cfg.tracking.sample_rows))
        return loss


def _accuracy(ctx: RunContext, rollouts: list[Rollout]) -> float:
    """Accuracy of the student's own full responses this step (the on-policy view)."""
    scores = ctx.domain.score_batch([r.item for r in rollouts], [r.response_text for r in rollouts])
    return sum(s.correct for s in scores) / len(scores)


def train(ctx: RunContext) -> None:
    bridge = TokenizerBridge(ctx.student.tokenizer, ctx.teacher.tokenizer)
    if not bridge.same:
        # The check prepare.check_pair makes before the run exists (here too for zoo pairs).
        names = (ctx.config.student.name, ctx.config.teacher.name)
        problem = bridge_problem(ctx.student.tokenizer, ctx.teacher.tokenizer, ctx.domain, names)
        if problem:
            raise ValueError(f"rose: {problem}")
    run_online(ctx, partial(ROSETrainer, bridge=bridge), CECallback(ctx))
