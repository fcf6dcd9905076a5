"""A run over several domains (`--domain rlve,dapo`): its config, its teachers and its items."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distill.cli.app import app, model_overrides
from distill.config import ConfigError, resolve_config
from distill.domains import build_domain
from distill.domains.base import Item
from distill.domains.mixed import alternating_order, draw, part_of, shares, step_plan


def test_two_domains_make_one_mixed_config_with_each_parts_own_fields() -> None:
    cfg = resolve_config("rlve,dapo", "opd", None, ["domain.parts.dapo.max_value=30", "domain.mix.dapo=6"])
    assert cfg.domain.name == "rlve+dapo"
    assert cfg.domain.parts["dapo"].max_value == 30  # type: ignore[attr-defined]
    assert cfg.domain.weights() == {"rlve": 0.25, "dapo": 0.75}  # type: ignore[attr-defined]
    # Its own preset: 1.2x the two single-domain OPD budgets together (200 and 400 steps), rlve:dapo 2:3.
    single = sum(resolve_config(d, "opd").optim.max_steps for d in ("rlve", "dapo"))
    assert cfg.optim.max_steps == round(1.2 * single) == 720
    preset = resolve_config("rlve,dapo", "opd")
    assert preset.domain.weights() == pytest.approx({"rlve": 0.4, "dapo": 0.6})  # type: ignore[attr-defined]
    # A mix without a preset of its own takes its first part's.
    assert resolve_config("dapo,rlve", "opd").optim.max_steps == resolve_config("dapo", "opd").optim.max_steps


@pytest.mark.parametrize(
    ("domain", "method", "overrides", "message"),
    [
        (
            "rlve,sciworld",
            "opd",
            [],
            "a run over several domains takes single-turn ones; sciworld is multi-turn",
        ),
        ("rlve,rlve", "opd", [], "name each domain once"),
        ("rlve,dapo", "rose", [], "method rose trains on one domain per run"),
        ("rlve,dapo", "opd", ["teachers.dapo.name=zoo:teacher"], "domain rlve has no teacher"),
        (
            "rlve",
            "opd",
            ["teachers.dapo.name=zoo:teacher"],
            "teachers.dapo: dapo is not a domain of this run",
        ),
        (
            "rlve,dapo",
            "opsd",
            ["teachers.dapo.name=x", "teachers.rlve.name=y"],
            "opsd's teacher is the student",
        ),
        ("rlve,dapo", "opd", ["domain.mix.rlve=0"], "mix.rlve: a weight must be > 0"),
        ("rlve,dapo", "opd", ["domain.mix.aime=1"], "mix.aime: aime is not a part of rlve+dapo"),
        (
            "rlve,dapo",
            "opd",
            ["domain.lr.dapo=1e-3"],
            "lr: a step trains every domain at once; set domain.alternate=true",
        ),
        ("rlve,dapo", "opd", ["domain.alternate=true", "domain.lr.aime=1e-3"], "lr.aime: aime is not a part"),
        (
            "rlve,dapo",
            "opd",
            ["domain.alternate=true", "domain.lr.dapo=0"],
            "lr.dapo: a learning rate must be > 0",
        ),
        (
            "rlve,dapo",
            "opd",
            ["teacher.name=other", "teachers.rlve.name=a", "teachers.dapo.name=b"],
            "two teachers for rlve",
        ),
        ("rlve", "opd", ["teacher.name=other", "teachers.rlve.name=a"], "two teachers for rlve"),
        (
            "rlve,dapo",
            "opd",
            ["method.loss=jsd"],
            "method.loss=jsd: a run over rlve+dapo has a teacher per domain",
        ),
    ],
)
def test_a_mix_that_cannot_run_is_one_config_error(
    domain: str, method: str, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_config(domain, method, None, overrides)


def test_a_one_domain_runs_teacher_named_by_its_domain_is_its_teacher() -> None:
    cfg = resolve_config("rlve", "opd", None, ["teachers.rlve.name=/models/t"])
    assert (cfg.teacher.name, cfg.teachers) == ("/models/t", {})


def test_teacher_flags_name_one_teacher_or_each_domains() -> None:
    assert model_overrides(None, ["zoo:teacher"]) == ["teacher.name=zoo:teacher"]
    assert model_overrides("s", ["rlve=zoo:teacher", "dapo=/models/t"]) == [
        "student.name=s",
        "teachers.rlve.name=zoo:teacher",
        "teachers.dapo.name=/models/t",
    ]
    # A path with an '=' that is not a domain's stays one model.
    assert model_overrides(None, ["/models/a=b"]) == ["teacher.name=/models/a=b"]
    with pytest.raises(ValueError, match="two teachers for rlve"):
        model_overrides(None, ["rlve=a", "rlve=b"])
    with pytest.raises(ValueError, match="two teachers without a domain"):
        model_overrides(None, ["a", "b"])


@pytest.mark.parametrize(
    ("teachers", "words"),
    [
        (["rlve=a", "rlve=b"], "two teachers for rlve"),
        (["dapo=zoo:teacher"], "domain rlve has no teacher"),
        (
            ["rlve=zoo:teacher", "dapo=/nowhere/teacher"],
            "teachers.dapo.name: no such folder /nowhere/teacher",
        ),
    ],
)
def test_the_cli_refuses_a_teacher_it_cannot_use_and_writes_nothing(
    teachers: list[str], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTILL_WORKSPACE", str(tmp_path))
    args = ["run", "--domain", "rlve,dapo", *(x for t in teachers for x in ("--teacher", t))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert words in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "runs").exists()


def _item(i: int, part: str) -> Item:
    return Item(id=f"{part}-{i}", prompt=f"{part} {i}", answer="1", meta={"domain": part})


def test_draw_keeps_the_weights_and_all_items_of_a_small_part() -> None:
    parts = {"a": [_item(i, "a") for i in range(100)], "b": [_item(i, "b") for i in range(10)]}
    items = draw(parts, {"a": 0.5, "b": 0.5}, 40)
    assert Counter(part_of(i) for i in items) == {"a": 20, "b": 20}  # the weights hold
    a = [i.id for i in items if part_of(i) == "a"]
    assert sorted(a) == sorted(f"a-{i}" for i in range(20))  # a's first items, none twice
    b = Counter(i.id for i in items if part_of(i) == "b")
    assert b == {f"b-{i}": 2 for i in range(10)}  # b's 10, each twice
    assert draw(parts, {"a": 0.5, "b": 0.5}, 40) == items  # one fixed order
    # A total that leaves every share within its part: each part's first items, none twice.
    small = draw(parts, {"a": 0.5, "b": 0.5}, 16)
    assert sorted(i.id for i in small) == sorted([f"a-{i}" for i in range(8)] + [f"b-{i}" for i in range(8)])


def test_shares_add_up_to_the_total() -> None:
    assert shares({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 10) == {"a": 4, "b": 3, "c": 3}
    assert shares({"rlve": 1 / 3, "dapo": 2 / 3}, 12288) == {"rlve": 4096, "dapo": 8192}
    assert shares({"rlve": 1 / 3, "dapo": 2 / 3}, 4096) == {"rlve": 1365, "dapo": 2731}


def test_alternate_steps_follow_the_weights_spread_over_the_run() -> None:
    plan = step_plan({"rlve": 1 / 3, "dapo": 2 / 3}, 600)
    assert Counter(plan) == {"rlve": 200, "dapo": 400}
    assert plan[:6] == ["dapo", "rlve", "dapo"] * 2
    # At any step each domain has had its share to within one step.
    for n in range(1, 601):
        assert abs(plan[:n].count("rlve") - n / 3) <= 1
    assert step_plan({"a": 0.5, "b": 0.5}, 4) == ["a", "b", "a", "b"]  # a tie: the first part


def test_each_alternate_step_takes_its_domains_items_in_turn() -> None:
    items = [_item(i, "a") for i in range(5)] + [_item(i, "b") for i in range(3)]
    order = alternating_order(items, ["a", "b", "a", "b"], 2, seed=0)
    steps = [[items[i] for i in order[k : k + 2]] for k in range(0, 8, 2)]
    assert [{part_of(i) for i in step} for step in steps] == [{"a"}, {"b"}, {"a"}, {"b"}]
    a = [i.id for step in steps[0::2] for i in step]
    assert len(set(a)) == 4  # a's items without repeats until all 5 are used
    b = [i.id for step in steps[1::2] for i in step]
    assert set(b[:3]) == {"b-0", "b-1", "b-2"}  # past b's last item, round again
    assert alternating_order(items, ["a", "b", "a", "b"], 2, seed=0) == order
    assert alternating_order(items, ["a", "b", "a", "b"], 2, seed=1) != order
    with pytest.raises(ValueError, match="no training items of c"):
        alternating_order(items, ["c"], 2, seed=0)


@pytest.mark.integration
def test_mixed_items_are_tagged_and_scored_by_their_own_domain(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DISTILL_WORKSPACE", str(tmp_path))
    cfg = resolve_config("rlve,dapo", "opd", None, ["domain.train_size=64", "domain.mix.dapo=2"])
    domain = build_domain(cfg.domain)
    try:
        train = domain.train_items()
        assert Counter(part_of(i) for i in train) == {"rlve": 32, "dapo": 32}
        evals = domain.eval_items()
        assert {part_of(i) for i in evals} == {"rlve", "dapo"}
        # Each row goes to its own verifier: the right answer scores 1 on either domain.
        rows = [next(i for i in train if part_of(i) == p) for p in ("rlve", "dapo")]
        scores = domain.score_batch(rows, [f"\\boxed{{{i.answer}}}" for i in rows])
        assert [s.correct for s in scores] == [True, True]
        wrong = domain.score_batch(rows, ["\\boxed{no}", "\\boxed{no}"])
        assert [s.correct for s in wrong] == [False, False]
    finally:
        domain.close()
