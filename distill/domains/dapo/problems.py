"""The embedded default's math: short generated word problems with integer answers.

Each problem is a start quantity and a few operations on it ("finds 3 more", "gives away 4",
"doubles", "gives away half"), asked as "How many ... now?". The worked solution is one line
per operation (`12 + 3 = 15.`) and the boxed answer, short enough that the zoo's tiny teacher
learns it and long enough that prefix/continuation budgets matter.

Problems come out as plain rows (`problem`, `answer`, `solution`, `meta`) and go through the
same loader and grader as real data. With an `rng`, `solution_segments` gives a variant with one
wrong intermediate result marked untrainable (the rest correct), as the RLVE solutions do: a
teacher trained on such traces keeps going sensibly after a student's mistake.
"""

from __future__ import annotations

import random
from typing import Any

Segments = list[tuple[str, bool]]

NAMES = ("Ann", "Ben", "Cal", "Dee", "Eva", "Gus", "Ivy", "Max", "Sam", "Zoe")
THINGS = ("apples", "books", "coins", "cards", "pens", "shells", "stamps", "eggs")


# Operands stay small (1-5, doubling, halving) and values at most `max_value` (20 by default):
# about 250 distinct arithmetic facts, which a 2-layer d128 model learns from the zoo's 400 steps.
# With 2-digit operands and values to 99 (~4,000 facts) the same teacher did not (docs/dapo.md).
MAX_OPERAND = 5


def _op(rng: random.Random, who: str, value: int, max_value: int) -> tuple[str, str, int] | None:
    """One operation applicable to `value`: (sentence, expression, result), or None."""
    kind = rng.choice(("add", "sub", "mul", "div"))
    if kind == "add" and value < max_value:
        c = rng.randint(1, min(MAX_OPERAND, max_value - value))
        return f"Then {who} finds {c} more.", f"{value} + {c}", value + c
    if kind == "sub" and value > 1:
        c = rng.randint(1, min(MAX_OPERAND, value - 1))
        return f"Then {who} gives away {c}.", f"{value} - {c}", value - c
    if kind == "mul" and 2 * value <= max_value:
        return f"Then the amount {who} has doubles.", f"{value} * 2", value * 2
    if kind == "div" and value % 2 == 0:
        return f"Then {who} gives away half of them.", f"{value} / 2", value // 2
    return None


def generate(seed: int, min_steps: int, max_steps: int, max_value: int) -> dict[str, Any]:
    """One problem row from its seed (deterministic)."""
    rng = random.Random(seed)
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    if rng.random() < 0.5:
        a, b = rng.randint(2, 4), rng.randint(2, 4)
        value = a * b
        sentences = [f"{name} has {a} bags with {b} {thing} in each bag."]
        lines: list[tuple[str, int]] = [(f"{a} * {b}", value)]
    else:
        value = rng.randint(3, min(12, max_value))
        sentences = [f"{name} has {value} {thing}."]
        lines = []
    steps = rng.randint(min_steps, max_steps)
    while len(sentences) < steps + 1:
        op = _op(rng, name, value, max_value)
        if op is None:
            continue
        sentence, expr, value = op
        sentences.append(sentence)
        lines.append((expr, value))
    sentences.append(f"How many {thing} does {name} have now?")
    worked: list[list[Any]] = [[expr, result] for expr, result in lines]
    return {
        "id": f"gen-{seed}",
        "problem": " ".join(sentences),
        "answer": str(value),
        "solution": "".join(text for text, _ in segments(worked, value)),
        "meta": {"lines": worked, "seed": seed},
    }


def _wrong(value: int, rng: random.Random) -> int:
    delta = rng.choice((-3, -2, -1, 1, 2, 3, 10))
    return value + delta if value + delta >= 0 else value + 1


def segments(lines: list[list[Any]], answer: int, rng: random.Random | None = None) -> Segments:
    """The worked solution; with `rng`, one intermediate result is wrong and untrainable."""
    corrupt_at = rng.randrange(len(lines) - 1) if rng is not None and len(lines) > 1 else -1
    out: Segments = []
    for i, (expr, result) in enumerate(lines):
        if i == corrupt_at:
            assert rng is not None
            out += [(f"{expr} =", True), (f" {_wrong(int(result), rng)}", False), (".\n", True)]
        else:
            out.append((f"{expr} = {result}.\n", True))
    out.append((f"\\boxed{{{answer}}}", True))
    return out
