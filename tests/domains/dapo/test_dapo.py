"""The dapo domain: embedded generated problems, real DAPO-Math-17k files, math-verify grading."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from distill.config import ConfigError, domain_config, resolve_config
from distill.domains import build_domain
from distill.domains.base import Item
from distill.domains.dapo import DapoDomain, build, dedup
from distill.domains.dapo.config import DapoDomainConfig
from distill.domains.dapo.data import BOXED_INSTRUCTION, DataError
from distill.domains.dapo.problems import generate

SHARED = Path(
    os.environ.get("DISTILL_SHARED_DATA", Path(__file__).resolve().parents[3].parent / "shared/data")
)
needs_shared = pytest.mark.skipif(
    not (SHARED / "dapo_math_17k_first2000.parquet").exists(),
    reason=f"reference data not found at {SHARED} (set DISTILL_SHARED_DATA to the shared/data folder)",
)


def small(**fields: object) -> DapoDomainConfig:
    return DapoDomainConfig(train_size=128, eval_size=32, **fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def domain() -> Iterator[DapoDomain]:
    d = build(small())
    yield d
    d.close()


def test_registry_and_config() -> None:
    cfg = domain_config("dapo", train_size=8)
    assert isinstance(cfg, DapoDomainConfig) and cfg.data is None
    assert isinstance(build_domain(cfg), DapoDomain)
    with pytest.raises(ConfigError, match="domain.nope"):
        domain_config("dapo", nope=1)
    for method in ("sft", "opd", "rose", "opsd"):
        assert resolve_config("dapo", method).domain.name == "dapo"
    # OPSD's teacher is the student's own step-0 weights: its own preset, not the schema's defaults.
    opsd = resolve_config("dapo", "opsd")
    assert opsd.method.teacher_weights == "base" and opsd.eval.eval_teacher is False


def test_embedded_items(domain: DapoDomain) -> None:
    train, ev = domain.train_items(), domain.eval_items()
    assert len(train) == 128 and len(ev) == 32
    assert len({i.id for i in train + ev}) == 160
    # Eval problems never appear in training; problems are distinct.
    assert not {i.prompt for i in train} & {i.prompt for i in ev}
    assert len({i.prompt for i in train}) == 128
    for item in train + ev:
        assert item.id.startswith("dapo-gen-")
        assert item.prompt.endswith(BOXED_INSTRUCTION)
        assert int(item.answer) >= 0 and item.answer == str(int(item.answer))
        assert item.solution is not None and item.solution.endswith(f"\\boxed{{{item.answer}}}")


def test_generation_is_deterministic_and_seeded() -> None:
    assert generate(7, 2, 3, 99) == generate(7, 2, 3, 99)
    assert generate(7, 2, 3, 99)["problem"] != generate(8, 2, 3, 99)["problem"]
    a, b = build(small()), build(small(eval_seed=5))
    assert [i.prompt for i in a.eval_items()] != [i.prompt for i in b.eval_items()]
    assert [i.prompt for i in a.train_items()] == [i.prompt for i in build(small()).train_items()]


def test_worked_solutions_are_right() -> None:
    # Every line of every worked solution is true arithmetic, and the chain ends at the answer.
    for seed in range(300):
        row = generate(seed, 2, 4, 20)
        lines = row["meta"]["lines"]
        value = None
        for expr, result in lines:
            left, op, right = expr.split(" ")
            if value is not None:
                assert int(left) == value
            got = {"+": int(left) + int(right), "-": int(left) - int(right), "*": int(left) * int(right)}.get(
                op, int(left) // int(right)
            )
            if op == "/":
                assert int(left) % int(right) == 0
            assert got == result and 0 <= result <= 20
            # Small operands keep the arithmetic facts few enough for the zoo teacher.
            assert op in "+-" and int(right) <= 5 or op in "*/" and int(right) in (2, 3, 4)
            value = result
        assert str(value) == row["answer"]
        assert 2 <= len(row["problem"].split("Then ")) - 1 <= 4


def test_every_solution_grades_correct(domain: DapoDomain) -> None:
    items = domain.eval_items()
    scores = domain.score_batch(items, [i.solution or "" for i in items])
    assert all(s.correct and s.formatted and s.reward == 1.0 for s in scores)
    # The same number without \boxed{} is not an answer; a wrong boxed number is wrong.
    item = items[0]
    assert domain.score(item, f"The answer is {item.answer}.").correct is False
    assert domain.score(item, f"The answer is {item.answer}.").formatted is False
    wrong = domain.score(item, f"\\boxed{{{int(item.answer) + 1}}}")
    assert (wrong.correct, wrong.formatted, wrong.reward) == (False, True, 0.0)


def test_corrupted_solutions(domain: DapoDomain) -> None:
    rng = random.Random(0)
    item = next(i for i in domain.train_items() if len(i.meta["lines"]) >= 2)
    clean = domain.solution_segments(item)
    assert "".join(t for t, _ in clean) == item.solution and all(ok for _, ok in clean)
    bad = domain.solution_segments(item, rng)
    masked = [t for t, ok in bad if not ok]
    assert len(masked) == 1 and masked[0].strip().lstrip("-").isdigit()
    # Everything but the wrong number is the clean solution: the chain continues from the right value.
    text = "".join(t for t, _ in bad)
    assert text != item.solution and text.endswith(f"\\boxed{{{item.answer}}}")
    assert len(text.splitlines()) == len(item.solution.splitlines())


def test_config_errors() -> None:
    with pytest.raises(ValueError, match=r"max_steps \(1\) must be >= min_steps \(2\)"):
        small(max_steps=1)
    with pytest.raises(ValueError, match="eval_data needs eval_benchmark"):
        small(eval_data="x.json")
    with pytest.raises(ConfigError, match="domain: unknown eval_benchmark 'aime99'; known: aime25"):
        domain_config("dapo", eval_benchmark="aime99")


def test_local_file_dedup_shuffle_and_malformed_rows(tmp_path: Path) -> None:
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    rows.append({"problem": "What is 3  +  3?", "answer": "6"})  # a whitespace-only duplicate
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = build(DapoDomainConfig(data=str(path), train_size=100, eval_size=2))
    train, ev = d.train_items(), d.eval_items()
    assert len(train) + len(ev) == 10 and not {i.id for i in train} & {i.id for i in ev}
    order = [i.id for i in ev + train]
    assert order != sorted(order, key=lambda s: int(s.split("-")[1]))  # shuffled by seed
    other = build(DapoDomainConfig(data=str(path), train_size=100, eval_size=2, seed=1))
    assert [i.id for i in other.eval_items() + other.train_items()] != order
    assert d.score(ev[0], f"so \\boxed{{{ev[0].answer}}}").correct

    path.write_text(path.read_text() + '{"problem": "no answer here"}\n')
    with pytest.raises(DataError, match=r"train\.jsonl: row 11: field 'answer' is missing"):
        build(DapoDomainConfig(data=str(path))).train_items()


def test_dedup_keeps_first() -> None:
    items = [Item("a", "x  y", "1"), Item("b", "x y", "2"), Item("c", "z", "3")]
    assert [i.id for i in dedup(items)] == ["a", "c"]


@needs_shared
def test_real_dapo_and_aime25() -> None:
    cfg = DapoDomainConfig(
        data=str(SHARED / "dapo_math_17k_first2000.parquet"),
        eval_benchmark="aime25",
        eval_data=str(SHARED / "aime25.json"),
        train_size=5000,
    )
    d = build(cfg)
    try:
        # 2,000 rows hold 1,978 distinct problems; the eval set is the benchmark.
        assert len(d.train_items()) == 1978 and len(d.eval_items()) == 30
        assert d.eval_items()[0].id == "aime25-1"
        item = d.train_items()[0]
        assert d.score(item, f"\\boxed{{{item.answer}}}").correct
        assert not d.score(item, item.answer).correct
    finally:
        d.close()


def test_solutions_fit_the_zoo_budget(domain: DapoDomain) -> None:
    # The zoo evaluates with 64 new tokens: a worked solution plus EOS must fit, in both families.
    from distill.zoo.recipes import RECIPES, TokenizerRecipe
    from distill.zoo.tokenizers import train_tokenizer

    corpus = domain.corpus()
    for name in ("tok-qwen", "tok-llama"):
        recipe = RECIPES[name]
        assert isinstance(recipe, TokenizerRecipe)
        tok = train_tokenizer(recipe.family, corpus, recipe.vocab_size)
        lengths = [len(tok(i.solution)["input_ids"]) for i in domain.train_items() + domain.eval_items()]
        assert max(lengths) + 1 <= 64, (name, max(lengths))


@pytest.mark.integration
def test_zoo_builds_a_dapo_teacher(tmp_path: Path) -> None:
    # The zoo trains on the domain's worked solutions (with corrupted, loss-masked steps) and
    # evaluates through the math grader; the tiny recipes only check the path, not competence.
    from conftest import TINY_RECIPES

    from distill.zoo.build import ensure_built, read_entry
    from distill.zoo.recipes import ModelRecipe

    recipes = dict(TINY_RECIPES)
    teacher = recipes["teacher"]
    assert isinstance(teacher, ModelRecipe)
    recipes["teacher"] = teacher.model_copy(update={"corrupt_prob": 0.3})
    cfg = DapoDomainConfig(train_size=256, eval_size=16)
    path = ensure_built(tmp_path, "teacher", cfg, show_progress=False, recipes=recipes)
    entry = read_entry(path)
    assert entry is not None and entry.domain == "dapo" and path.parent.name == "dapo"
    assert entry.eval["items"] == 16.0 and 0.0 <= entry.eval["accuracy"] <= 1.0
    assert (path / "config.json").exists() and (path / "tokenizer.json").exists()
