"""Planning a grid: matched budgets per domain, cells named once, bad input refused before anything exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distill.config import resolve_config
from distill.grid.spec import Cell, GridRefused, _resolve, cell_config, plan


def _plan(domains: str = "rlve,dapo", methods: str = "sft,opd,rose,opsd", **kw):
    args = {"seeds": 2, "overrides": [], "skip": [], "grid_id": "g", "argv": []}
    args.update(kw)
    return plan(domains, methods, **args)


def test_every_method_of_a_domain_gets_the_domains_budget() -> None:
    spec = _plan(overrides=["optim.max_steps=7", "eval.items=9"])
    assert [c.label for c in spec.cells()][:3] == ["rlve/sft/s0", "rlve/sft/s1", "rlve/opd/s0"]
    assert len(spec.cells()) == 16
    for domain in ("rlve", "dapo"):
        budget = spec.budgets[domain]
        assert (budget.steps, budget.eval_items) == (7, 9)
        for method in ("sft", "opd", "rose", "opsd"):
            config = cell_config(spec, Cell(domain, method, 1))
            assert (config.optim.max_steps, config.eval.items, config.seed) == (7, 9, 1)
            assert config.tracking.run_name == f"g-{domain}-{method}-s1"
            if method == "sft":  # no rollouts: the same sequences per step
                assert config.optim.batch_size == budget.prompts_per_step * budget.samples_per_prompt
            else:
                assert config.rollout.prompts_per_step == budget.prompts_per_step
                assert config.rollout.num_generations == budget.samples_per_prompt
    # With no override a domain's budget is its OPD preset's, and each method's own preset has it:
    # a cell is the run `distill run --domain <d> --method <m>` makes (the numbers in the presets).
    for domain in ("rlve", "dapo", "sciworld"):
        budget = _plan(domain, seeds=1).budgets[domain]
        for method in ("sft", "opd", "rose", "opsd"):
            assert budget.of(_resolve(domain, method, [])) == budget, (domain, method)


def test_scoped_overrides_reach_their_cells_only() -> None:
    spec = _plan(
        "rlve,dapo", "sft,opd", seeds=1, overrides=["sft:method.temperature=0.7", "dapo:optim.lr=2e-5"]
    )
    assert cell_config(spec, Cell("rlve", "sft", 0)).method.temperature == 0.7
    assert cell_config(spec, Cell("dapo", "opd", 0)).optim.lr == 2e-5
    assert cell_config(spec, Cell("rlve", "opd", 0)).optim.lr != 2e-5
    with pytest.raises(GridRefused, match="budget"):  # a method alone cannot change its domain's budget
        _plan("rlve", "sft,opd", seeds=1, overrides=["opd:optim.max_steps=3"])


def test_skip_leaves_a_cell_out() -> None:
    spec = _plan("rlve", "sft,opd", seeds=1, skip=["rlve/opd"])
    assert [c.label for c in spec.cells()] == ["rlve/sft/s0"]


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"domains": "rlve,nope"}, "unknown domain 'nope'"),
        ({"methods": "sft,sft"}, "--method"),
        ({"methods": "sft,nope"}, "--method: unknown method 'nope'; known: sft"),
        ({"seeds": 0}, "--seeds"),
        ({"skip": ["rlve/jsd"]}, "--skip 'rlve/jsd'"),
        ({"overrides": ["seed=3"]}, "override 'seed=3'"),
        ({"overrides": ["optim.lr=-1"]}, "optim.lr"),
        ({"grid_id": "a/b"}, "--name"),
        ({"overrides": ["jsd:method.beta=1"]}, "'jsd' is no method, domain"),
        ({"overrides": ["method.temperature=0.7"]}, "rlve/opd: invalid config: method.temperature"),
    ],
)
def test_bad_input_is_refused_naming_it(kw: dict, words: str) -> None:
    with pytest.raises(GridRefused, match=None) as info:
        _plan(**kw)
    assert words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--method", "opd", "optim.max_steps=x"], "optim.max_steps"),
        (["--method", "nope"], "--method: unknown method 'nope'"),
    ],
)
def test_cli_refuses_bad_input_with_one_line_and_writes_nothing(
    args: list[str], words: str, tmp_path: Path
) -> None:
    env = {"DISTILL_WORKSPACE": str(tmp_path / "ws"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "distill", "grid", "--domain", "rlve", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and words in proc.stderr
    assert not (tmp_path / "ws").exists()


def test_a_mixed_domain_is_a_row_of_its_own() -> None:
    spec = _plan("rlve,dapo,rlve+dapo", "opd", seeds=1)
    assert [c.label for c in spec.cells()] == ["rlve/opd/s0", "dapo/opd/s0", "rlve+dapo/opd/s0"]
    # The mix's budget is its own preset's (1.2x the two domains' steps together), not a part's.
    together = spec.budgets["rlve"].steps + spec.budgets["dapo"].steps
    assert spec.budgets["rlve+dapo"].steps == resolve_config("rlve,dapo", "opd").optim.max_steps
    assert spec.budgets["rlve+dapo"].steps == round(1.2 * together)
    cfg = cell_config(spec, Cell("rlve+dapo", "opd", 0))
    assert cfg.domain.name == "rlve+dapo" and cfg.domain.weights()["dapo"] == pytest.approx(0.6)
    # A method that trains one domain per run is refused with the cell to leave out.
    with pytest.raises(GridRefused, match=r"--skip rlve\+dapo/sft"):
        _plan("rlve+dapo", "sft,opd", seeds=1)
    assert [c.label for c in _plan("rlve+dapo", "sft,opd", seeds=1, skip=["rlve+dapo/sft"]).cells()] == [
        "rlve+dapo/opd/s0"
    ]
