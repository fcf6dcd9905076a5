"""The teacher-budget and coverage figures that teacher-SFT and ROSE both log (DESIGN.md names).

The reference's failure was a teacher budget of 1,024 tokens with continuations of 960-1,016
(share 94-99%, nearly every one truncated) covering ~6% of the student's chain; these figures
make that visible at every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from distill import registry
from distill.config import ROSEMethod
from distill.engines.context import BudgetCheck, check_budget
from distill.methods.views import teacher_view

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.domains.base import Domain, Item
    from distill.engines.base import Engine
    from distill.episodes.episode import Episode


def teacher_budget(tokens: Sequence[int], truncated: Sequence[bool], budget: int) -> dict[str, float]:
    """CE-target tokens the teacher wrote per sample (mean, max), the share of its budget t they
    fill (mean / t), and the share of samples that ended at t without EOS."""
    if len(tokens) != len(truncated):
        raise ValueError(f"teacher_budget: {len(tokens)} token counts but {len(truncated)} truncation flags")
    if not tokens:
        return {}
    mean = sum(tokens) / len(tokens)
    return {
        "teacher/ce_target_tokens_mean": mean,
        "teacher/ce_target_tokens_max": float(max(tokens)),
        "teacher/ce_target_share": mean / budget,
        "teacher/truncation_rate": sum(bool(t) for t in truncated) / len(truncated),
    }


def student_completions(lengths: Sequence[int], truncated: Sequence[bool]) -> dict[str, float]:
    """The student's own responses: length (mean, max) and the share that hit the budget."""
    if not lengths:
        return {}
    return {
        "student/completion_tokens_mean": sum(lengths) / len(lengths),
        "student/completion_tokens_max": float(max(lengths)),
        "student/truncation_rate": sum(bool(t) for t in truncated) / len(truncated),
    }


def supervised_share(supervised: Sequence[int], full_lengths: Sequence[int]) -> float:
    """Supervised tokens / the length of the student's full responses on the same prompts."""
    total = sum(full_lengths)
    return sum(supervised) / total if total else 0.0


def teacher_turns(episodes: Sequence[Episode], budget: int, writer: str = "teacher") -> dict[str, float]:
    """The teacher budget figures over the turns `writer` wrote (episodes: one budget per turn),
    counted in the writer's own tokens: a bridged teacher's turn holds student tokens in the
    episode, but its budget `budget` was spent in teacher tokens (DESIGN.md: budgets in the
    teacher's tokens, coverage and the mask in the student's)."""
    turns = [t for ep in episodes for t in ep.turns if t.writer == writer]
    return teacher_budget([t.own_tokens for t in turns], [t.truncated for t in turns], budget)


def context_checks(config: RunConfig, domain: Domain, student: Engine, teacher: Engine) -> list[BudgetCheck]:
    """Every token budget of the run against the context of the model that spends it, on the
    longest prompts (engines/context.py): raises ContextError where a prompt leaves no room,
    returns the checks (their warnings say what is capped)."""
    if registry.domain_entry(domain.name).episodic:
        return []  # episodes grow turn by turn: the engines cap each turn at the room left
    train = _longest(domain.train_items())
    evals = _longest(domain.eval_items()[: config.eval.items])

    def lengths(engine: Engine, items: list[Item]) -> list[int]:
        return [len(engine.prompt_ids(item.prompt)) for item in items]

    def eval_lengths(engine: Engine) -> list[int]:
        # eval.overlong=skip: the eval leaves out what fills the context (evals/overlong.py).
        found = lengths(engine, evals)
        skip = cfg.eval.overlong == "skip" and engine.context is not None
        return [n for n in found if not (skip and n >= (engine.context or 0))]

    cfg, rollout = config, config.rollout.max_new_tokens
    checks = [
        check_budget(
            "eval.max_new_tokens",
            cfg.eval.max_new_tokens,
            student.context,
            eval_lengths(student),
            "student eval",
        )
    ]
    if cfg.eval.eval_teacher:
        checks.append(
            check_budget(
                "eval.max_new_tokens",
                cfg.eval.max_new_tokens,
                teacher.context,
                eval_lengths(teacher),
                "teacher eval",
            )
        )
    entry = registry.method_entry(cfg.method.name)
    if entry.teacher == "writes":
        checks.append(
            check_budget(
                "rollout.max_new_tokens",
                rollout,
                teacher.context,
                lengths(teacher, train),
                "teacher trajectories",
            )
        )
        return checks
    checks.append(
        check_budget(
            "rollout.max_new_tokens", rollout, student.context, lengths(student, train), "student rollouts"
        )
    )
    view = teacher_view(config, domain)
    if entry.teacher == "continues":
        assert isinstance(cfg.method, ROSEMethod), "the continuing teacher is ROSE's"
        # The teacher continues after the prompt and a prefix of up to the student's whole response.
        grown = [n + rollout for n in lengths(teacher, train)]
        checks.append(
            check_budget(
                "method.teacher_max_tokens",
                cfg.method.teacher_max_tokens,
                teacher.context,
                grown,
                "teacher continuations",
            )
        )
    elif view is not None:
        # The teacher scores the student's whole response after its own view of the problem.
        scored = [len(view.prompt_for(teacher, item)) for item in train]
        checks.append(
            check_budget("rollout.max_new_tokens", rollout, teacher.context, scored, "teacher scoring")
        )
    return checks


def _longest(items: Sequence[Item], n: int = 32) -> list[Item]:
    """The `n` items with the longest prompts in characters: a budget check tokenises these, not
    every training item (the engines' own cap covers any other)."""
    return sorted(items, key=lambda item: len(item.prompt), reverse=True)[:n]
