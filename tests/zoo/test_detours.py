"""Detour plans: one run of a mistaken action inserted into a gold play (no simulator here; the
played detour episodes are in tests/domains/sciworld/test_episode.py)."""

from __future__ import annotations

import random

import pytest

from distill.zoo.detours import detour_plan

GOLD = ["open door to kitchen", "go to kitchen", "open door to outside", "go to outside", "focus on bee"]


@pytest.mark.parametrize("seed", range(40))
def test_a_plan_is_the_gold_play_with_one_run_of_another_of_its_actions(seed: int) -> None:
    plan, wrong = detour_plan(GOLD, random.Random(seed))
    assert 1 <= len(wrong) <= 3
    at, end = min(wrong), max(wrong) + 1
    assert sorted(wrong) == list(range(at, end))  # one run
    assert [a for k, a in enumerate(plan) if k not in wrong] == GOLD  # the gold play goes on
    (mistake,) = {plan[k] for k in wrong}
    assert mistake in GOLD and mistake != GOLD[at]  # never the gold action due there


def test_plans_vary_across_draws_and_repeat_for_one_seed() -> None:
    draws = [detour_plan(GOLD, random.Random(s)) for s in range(60)]
    assert len({(tuple(p), frozenset(w)) for p, w in draws}) > 10
    assert {len(w) for _, w in draws} == {1, 2, 3}
    assert {min(w) for _, w in draws} == set(range(len(GOLD)))  # before any gold turn
    assert any(GOLD.index(p[min(w)]) < min(w) for p, w in draws)  # an earlier action again
    assert any(GOLD.index(p[min(w)]) > min(w) + 2 for p, w in draws)  # a later one, far ahead
    assert detour_plan(GOLD, random.Random(7)) == detour_plan(GOLD, random.Random(7))


def test_a_play_of_one_distinct_action_has_no_detour() -> None:
    assert detour_plan(["look around"], random.Random(0)) == (["look around"], set())
    assert detour_plan(["look around"] * 2, random.Random(0)) == (["look around"] * 2, set())
