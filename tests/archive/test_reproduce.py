"""`distill reproduce`: a tiny embedded-default-style run re-created from its manifest gives the same
eval numbers exactly (CPU, greedy eval); a recorded number that does not match is reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distill.cli.app import app

from .conftest import copy_run

pytestmark = pytest.mark.integration


def test_reproduce_matches_final_eval_exactly(workspace: Path, tiny_run: Path) -> None:
    run_dir = copy_run(tiny_run, workspace)
    result = CliRunner().invoke(app, ["reproduce", run_dir.name])
    assert result.exit_code == 0, result.output
    assert "reproduced exactly" in result.output
    [repro] = [p for p in (workspace / "runs").iterdir() if p.name.startswith(f"{run_dir.name}-repro-")]
    original = json.loads((run_dir / "summary.json").read_text())
    again = json.loads((repro / "summary.json").read_text())
    assert again["status"] == "FINISHED"
    for section in ("student_before", "teacher_score", "student_after"):
        assert again[section] == original[section], section
    # Same config and seed: the new run's manifest records the same resolved config.
    manifest = json.loads((repro / "manifest.json").read_text())
    recorded = json.loads((run_dir / "manifest.json").read_text())
    manifest["config"]["tracking"].pop("run_name")
    recorded["config"]["tracking"].pop("run_name")
    assert manifest["config"] == recorded["config"]


def test_reproduce_eval_only_and_mismatch(workspace: Path, tiny_run: Path) -> None:
    run_dir = copy_run(tiny_run, workspace)
    ok = CliRunner().invoke(app, ["reproduce", run_dir.name, "--eval-only"])
    assert ok.exit_code == 0 and "reproduced exactly" in ok.output, ok.output

    summary = json.loads((run_dir / "summary.json").read_text())
    summary["student_after"]["accuracy"] = summary["student_after"]["accuracy"] + 0.125
    (run_dir / "summary.json").write_text(json.dumps(summary))
    bad = CliRunner().invoke(app, ["reproduce", run_dir.name, "--eval-only"])
    assert bad.exit_code == 1, bad.output
    assert "did NOT reproduce" in bad.output
    assert [line for line in bad.output.splitlines() if "accuracy" in line and "NO" in line]

    missing = CliRunner().invoke(app, ["reproduce", "no-such-run"])
    assert missing.exit_code == 2 and "no run 'no-such-run'" in missing.output


def test_reproduce_eval_only_on_a_multi_turn_domain(
    workspace: Path, tiny_zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--eval-only` on an episodic domain plays the eval episodes again (the agent evaluator, as
    the run did), here on the registered text game, and matches the recorded Score exactly."""
    from episodes.textgame import ENTRY, NAME  # tests/ is on sys.path (rootdir conftest)

    from distill import registry
    from distill.config import resolve_config
    from distill.runner import execute
    from distill.settings import get_settings

    monkeypatch.setitem(registry.DOMAINS, NAME, ENTRY)
    overrides = [
        f"student.name={tiny_zoo.student}",
        f"teacher.name={tiny_zoo.teacher}",
        "domain.max_turns=3",
        "domain.eval_size=2",
        "optim.max_steps=1",
        "optim.batch_size=2",
        "method.keep_verified_only=false",
        "rollout.max_new_tokens=8",
        "eval.max_new_tokens=8",
        "eval.items=2",
        "eval.eval_teacher=false",
        "checkpoint.every_steps=1",
        "threads=1",
        "tracking.run_name=tg-repro",
    ]
    config = resolve_config(NAME, "sft", None, overrides)
    summary = execute(config, get_settings(), argv=["distill", "run", "(test)"], say=lambda _: None)
    assert summary["status"] == "FINISHED" and "score" in summary["student_after"]
    result = CliRunner().invoke(app, ["reproduce", "tg-repro", "--eval-only"])
    assert result.exit_code == 0, result.output
    assert "reproduced exactly" in result.output
    assert [line for line in result.output.splitlines() if "student_after" in line and "score" in line]
    # The eval's wall-clock figures are recorded but not compared: they measure the machine.
    assert "episodes_per_min" in summary["student_after"] and "episodes_per_min" not in result.output


def test_reproduce_eval_only_of_a_mixed_run_matches_each_domain(
    workspace: Path, tiny_mixed_run: Path
) -> None:
    """A run over rlve+dapo evaluated each domain on its own items: `--eval-only` does the same
    and every figure matches, in all and domain by domain."""
    run_dir = copy_run(tiny_mixed_run, workspace)
    result = CliRunner().invoke(app, ["reproduce", run_dir.name, "--eval-only"])
    assert result.exit_code == 0, result.output
    assert "reproduced exactly" in result.output
    for part in ("rlve", "dapo"):
        lines = result.output.splitlines()
        assert [
            line
            for line in lines
            if f"student_after [{part}]" in line and "accuracy" in line and "yes" in line
        ]
    from distill.archive.reproduce import reproduce_eval

    again = reproduce_eval(run_dir, say=lambda _: None, show_progress=False)
    sections = {c.section for c in again.comparisons}
    assert sections == {"student_after", "student_after [rlve]", "student_after [dapo]"}
    assert again.match and all(c.match for c in again.comparisons)
    assert {("student_after [dapo]", "accuracy"), ("student_after [rlve]", "items")} <= {
        (c.section, c.metric) for c in again.comparisons
    }


def test_reproduce_checks_every_domains_teacher(workspace: Path, tiny_zoo, tiny_mixed_run: Path) -> None:
    """The manifest pins each domain's teacher (`teacher@<domain>`): the re-run's are checked, a
    changed dapo teacher is refused, and the unused default `teacher` is neither built nor
    compared."""
    from distill.archive.dvcrepo import ArchiveError
    from distill.archive.reproduce import _manifest_config, check_start

    run_dir = copy_run(tiny_mixed_run, workspace)
    manifest, config = _manifest_config(run_dir)
    assert {"teacher@rlve", "teacher@dapo"} <= set(manifest["start"])
    assert config.teacher.name == "zoo:teacher"  # the default, unused by this run
    assert check_start(manifest, config, run_dir.name) == []
    config.teachers["dapo"] = config.teachers["dapo"].model_copy(update={"name": str(tiny_zoo.teacher_llama)})
    with pytest.raises(ArchiveError, match="teacher@dapo weights"):
        check_start(manifest, config, run_dir.name)
