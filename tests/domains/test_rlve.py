"""The RLVE domain on the real rlve-gym package: deterministic items, disjoint eval, real verifier."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
import torch

from distill.config import DomainBase, domain_config
from distill.domains import build_domain
from distill.domains.base import Item
from distill.domains.rlve import RLVEDomain, build
from distill.domains.rlve.config import RLVEDomainConfig


def small() -> DomainBase:
    return RLVEDomainConfig(train_size=64, eval_size=16)


@pytest.fixture(scope="module")
def domain() -> RLVEDomain:
    return build(small())


def _key(items: list[Item]) -> list[tuple[str, str, str, str | None]]:
    return [(i.id, i.prompt, i.answer, i.solution) for i in items]


def test_sizes_and_environments(domain: RLVEDomain) -> None:
    train, ev = domain.train_items(), domain.eval_items()
    assert len(train) == 64 and len(ev) == 16
    envs = {i.meta["environment"] for i in train + ev}
    assert envs == {"Sorting", "Multiplication"}
    for item in train + ev:
        assert item.id.startswith(item.meta["environment"] + "-")
        assert item.prompt.endswith("Put your final answer in \\boxed{}.")
        assert item.answer


def test_registry_builds_rlve() -> None:
    assert isinstance(build_domain(small()), RLVEDomain)
    with pytest.raises(ValueError, match="unknown domain 'nope'; known: rlve"):
        domain_config("nope")


def test_items_are_deterministic(domain: RLVEDomain) -> None:
    other = build(small())
    assert _key(other.train_items()) == _key(domain.train_items())
    assert _key(other.eval_items()) == _key(domain.eval_items())


def test_eval_seed_changes_the_eval_set() -> None:
    a = build(RLVEDomainConfig(train_size=1, eval_size=16))
    b = build(RLVEDomainConfig(train_size=1, eval_size=16, eval_seed=7))
    assert [i.prompt for i in a.eval_items()] != [i.prompt for i in b.eval_items()]


def test_eval_prompts_distinct(domain: RLVEDomain) -> None:
    prompts = [i.prompt for i in domain.eval_items()]
    assert len(set(prompts)) == len(prompts)
    ids = [i.id for i in domain.eval_items()]
    assert len(set(ids)) == len(ids)


def test_eval_prompts_never_in_train() -> None:
    # One small environment (1-digit multiplication: ~1,000 distinct prompts), many training
    # items: without the exclusion, eval prompts would almost surely reappear in training.
    cfg = RLVEDomainConfig(environments=["Multiplication"], train_size=300, eval_size=24)
    dom = build(cfg)
    eval_prompts = {i.prompt for i in dom.eval_items()}
    train_prompts = [i.prompt for i in dom.train_items()]
    assert len(train_prompts) == 300
    assert eval_prompts.isdisjoint(train_prompts)
    # The training set itself may repeat (documented), so the exclusion is not mere distinctness.
    assert len(eval_prompts) == 24


def test_also_disjoint_for_default_mix(domain: RLVEDomain) -> None:
    eval_prompts = {i.prompt for i in domain.eval_items()}
    assert eval_prompts.isdisjoint(i.prompt for i in domain.train_items())


def test_worked_solutions_are_correct(domain: RLVEDomain) -> None:
    items = domain.train_items() + domain.eval_items()
    assert all(i.solution for i in items)
    scores = domain.score_batch(items, [i.solution or "" for i in items])
    bad = [(i.id, i.solution) for i, s in zip(items, scores, strict=True) if not (s.correct and s.formatted)]
    assert not bad
    assert all(s.reward > 0 for s in scores)


def test_boxed_answer_is_correct(domain: RLVEDomain) -> None:
    for item in domain.eval_items():
        score = domain.score(item, f"\\boxed{{{item.answer}}}")
        assert score.correct and score.formatted


def _wrong(item: Item) -> str:
    if item.meta["environment"] == "Multiplication":
        return str(int(item.answer) + 1)
    return item.answer + " 1"  # one element too many


def test_wrong_boxed_answer_is_not_correct(domain: RLVEDomain) -> None:
    for item in domain.eval_items():
        score = domain.score(item, f"some work.\n\\boxed{{{_wrong(item)}}}")
        assert not score.correct, item.id
        assert score.formatted  # the format was right, the answer was not
        assert score.reward < 1.0


def test_unboxed_answer_is_not_formatted_nor_correct(domain: RLVEDomain) -> None:
    for item in domain.eval_items():
        score = domain.score(item, f"The answer is {item.answer}")
        assert not score.formatted, item.id
        assert not score.correct, item.id


def test_score_is_independent_of_order(domain: RLVEDomain) -> None:
    # The verifier is reconfigured from the item on every call: scoring another item in between
    # must not change the result.
    ev = domain.eval_items()
    a, b = ev[0], ev[1]
    first = domain.score(a, a.solution or "")
    domain.score(b, _wrong(b))
    assert domain.score(a, a.solution or "") == first
    assert domain.score(a, f"\\boxed{{{_wrong(a)}}}").correct is False


def test_score_batch_mismatched_lengths(domain: RLVEDomain) -> None:
    items = domain.eval_items()[:3]
    with pytest.raises(ValueError, match="3 items but 2 responses"):
        domain.score_batch(items, ["a", "b"])
    with pytest.raises(ValueError):
        domain.score_batch(items[:1], ["a", "b"])


def _draw() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_generation_preserves_caller_rng_state() -> None:
    random.seed(123)
    np.random.seed(123)
    torch.manual_seed(123)
    expected = _draw()

    random.seed(123)
    np.random.seed(123)
    torch.manual_seed(123)
    dom = build(RLVEDomainConfig(train_size=8, eval_size=4))
    dom.eval_items()
    dom.train_items()
    dom.score(dom.eval_items()[0], "\\boxed{1}")
    assert _draw() == expected


def test_unknown_environment_names_it() -> None:
    dom = build(RLVEDomainConfig(environments=["NoSuchPuzzle"], parameters={}, train_size=2, eval_size=2))
    with pytest.raises(ValueError, match="NoSuchPuzzle"):
        dom.eval_items()


def test_no_environments_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        build(RLVEDomainConfig(environments=[], train_size=2, eval_size=2))


def test_corpus_covers_prompts_and_solutions(domain: RLVEDomain) -> None:
    corpus = domain.corpus()
    items = domain.train_items() + domain.eval_items()
    assert len(corpus) == 2 * len(items)
    assert set(corpus) >= {i.prompt for i in items} | {i.solution for i in items if i.solution}


def test_default_items_are_pinned() -> None:
    # The presets' numbers and the zoo's cached models depend on these exact items.
    dom = build(small())
    blob = "\n".join(i.id + i.prompt + i.answer for i in dom.eval_items() + dom.train_items())
    assert hashlib.sha256(blob.encode()).hexdigest()[:16] == "daa286816adcc56d"


def test_named_environments_take_their_controllers_difficulty() -> None:
    # `domain.environments=[Division,LCM]` (a user's list): no parameters given, none guessed.
    from Gym.parameter_controllers import identifier2controller

    dom = build(RLVEDomainConfig(environments=["Division", "LCM"], train_size=64, eval_size=32))
    items = dom.eval_items() + dom.train_items()
    assert len(dom.eval_items()) == 32 and len(dom.train_items()) == 64
    for item in items:
        [start] = identifier2controller[item.meta["environment"]]().get_parameter_list()
        given = item.meta["config"]["parameter"]
        assert {k: given[k] for k in start} == start
        assert dom.score(item, f"\\boxed{{{item.answer}}}").correct


def test_the_controller_raises_the_difficulty_when_items_run_out() -> None:
    # TransmissionDelay's first level (N=4) has too few distinct prompts for 16 eval items:
    # update() raises it, as RLVE's adaptive difficulty does.
    dom = build(RLVEDomainConfig(environments=["TransmissionDelay"], train_size=8, eval_size=16))
    levels = [i.meta["config"]["parameter"]["N"] for i in dom.eval_items()]
    assert len({i.prompt for i in dom.eval_items()}) == 16
    assert levels[0] == 4 and max(levels) > 4 and levels == sorted(levels)
    # Parameters the user gives stay as given: too few items is an error naming them.
    fixed = build(
        RLVEDomainConfig(
            environments=["TransmissionDelay"],
            parameters={"TransmissionDelay": {"N": 4}},
            train_size=8,
            eval_size=16,
        )
    )
    with pytest.raises(ValueError, match=r"TransmissionDelay \{'N': 4\} \(domain.parameters\)"):
        fixed.eval_items()
