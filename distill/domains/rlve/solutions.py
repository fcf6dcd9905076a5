"""Worked solutions for the rlve-gym environments the embedded default uses.

A tiny teacher learns these step by step, and the steps make responses long enough for prefix
and continuation methods. Environments without a worked form get the bare boxed answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _sorting(parameter: dict[str, Any]) -> str:
    left = list(parameter["array"])
    lines = []
    while left:
        smallest = min(left)
        left.remove(smallest)
        rest = " ".join(map(str, left)) if left else "none"
        lines.append(f"smallest {smallest}, left {rest}.")
    answer = " ".join(map(str, parameter["gold_answer"]))
    return "\n".join(lines) + f"\n\\boxed{{{answer}}}"


def _multiplication(parameter: dict[str, Any]) -> str:
    a, b = int(parameter["a"]), int(parameter["b"])
    # Repeated addition: each step is one small sum the model can learn.
    if a == 0 or b == 0:
        return f"{a} * {b} = 0.\n\\boxed{{0}}"
    steps = ", ".join(str(b * i) for i in range(1, a + 1))
    return f"{a} * {b}: {steps}.\n\\boxed{{{a * b}}}"


WORKED: dict[str, Callable[[dict[str, Any]], str]] = {
    "Sorting": _sorting,
    "Multiplication": _multiplication,
}


def worked_solution(identifier: str, parameter: dict[str, Any]) -> str:
    solver = WORKED.get(identifier)
    if solver is not None:
        return solver(parameter)
    return f"\\boxed{{{parameter['reference_answer']}}}"
