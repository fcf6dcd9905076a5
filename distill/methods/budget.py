"""The teacher-budget and coverage figures that teacher-SFT and ROSE both log (DESIGN.md names).

The reference's failure was a teacher budget of 1,024 tokens with continuations of 960-1,016
(share 94-99%, nearly every one truncated) covering ~6% of the student's chain; these figures
make that visible at every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    """The teacher budget figures over the turns `writer` wrote (episodes: one budget per turn)."""
    from distill.episodes.data import writer_turns

    tokens, truncated = writer_turns(episodes, writer)
    return teacher_budget(tokens, truncated, budget)
