"""Worked solutions for the rlve-gym environments the embedded default uses.

A tiny teacher learns these step by step, and the steps make responses long enough for prefix
and continuation methods. Environments without a worked form get the bare boxed answer.

A solution is a list of segments `(text, trainable)`. With an `rng`, one intermediate number is
replaced by a wrong one and marked untrainable while the rest stays correct: a teacher trained on
such traces continues sensibly after a student's mistake instead of drifting off-distribution,
which is what on-policy methods (OPD scoring, ROSE continuation) need from it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

Segments = list[tuple[str, bool]]


def _wrong(value: int, rng: random.Random, high: int) -> int:
    choice = rng.randint(0, max(high, value + 2))
    return choice if choice != value else value + 1


def _sorting(parameter: dict[str, Any], rng: random.Random | None) -> Segments:
    left = list(parameter["array"])
    high = max(left) + 5
    corrupt_at = rng.randrange(len(left) - 1) if rng is not None and len(left) > 1 else -1
    segments: Segments = []
    for step in range(len(left)):
        smallest = min(left)
        left.remove(smallest)
        rest = " ".join(map(str, left)) if left else "none"
        if step == corrupt_at:
            assert rng is not None
            segments += [
                ("smallest", True),
                (f" {_wrong(smallest, rng, high)}", False),
                (f", left {rest}.\n", True),
            ]
        else:
            segments.append((f"smallest {smallest}, left {rest}.\n", True))
    answer = " ".join(map(str, parameter["gold_answer"]))
    segments.append((f"\\boxed{{{answer}}}", True))
    return segments


def _multiplication(parameter: dict[str, Any], rng: random.Random | None) -> Segments:
    a, b = int(parameter["a"]), int(parameter["b"])
    # Repeated addition: each step is one small sum the model can learn.
    if a == 0 or b == 0:
        return [(f"{a} * {b} = 0.\n\\boxed{{0}}", True)]
    partial = [b * i for i in range(1, a + 1)]
    corrupt_at = rng.randrange(a - 1) if rng is not None and a > 1 else -1
    segments: Segments = [(f"{a} * {b}:", True)]
    for i, value in enumerate(partial):
        sep = "," if i < len(partial) - 1 else "."
        if i == corrupt_at:
            assert rng is not None
            segments += [(f" {_wrong(value, rng, a * b + 9)}", False), (sep, True)]
        else:
            segments.append((f" {value}{sep}", True))
    segments.append((f"\n\\boxed{{{a * b}}}", True))
    return segments


WORKED: dict[str, Callable[[dict[str, Any], random.Random | None], Segments]] = {
    "Sorting": _sorting,
    "Multiplication": _multiplication,
}


def solution_segments(
    identifier: str, parameter: dict[str, Any], rng: random.Random | None = None
) -> Segments:
    solver = WORKED.get(identifier)
    if solver is not None:
        return solver(parameter, rng)
    return [(f"\\boxed{{{parameter['reference_answer']}}}", True)]


def worked_solution(identifier: str, parameter: dict[str, Any]) -> str:
    return "".join(text for text, _ in solution_segments(identifier, parameter))
