"""RunDir: run ids are one folder under runs/ (never a way out of it), metrics.jsonl survives a
line cut short by a kill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distill.settings import Settings
from distill.tracking.rundir import RunDir, RunRefused

BAD_NAMES = ["../../escaped-run", "a/b", "a\\b", "..", ".hidden", "", "   "]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_create_refuses_a_name_that_is_not_one_folder(tmp_path: Path, name: str) -> None:
    runs_dir = tmp_path / "ws" / "runs"
    with pytest.raises(RunRefused, match="tracking.run_name") as refused:
        RunDir.create(runs_dir, name)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "ws").exists() and not (tmp_path / "escaped-run").exists()


def test_the_config_refuses_the_same_names_naming_the_field() -> None:
    from pydantic import ValidationError

    from distill.config import ConfigError, TrackingConfig, resolve_config

    for name in BAD_NAMES:
        with pytest.raises(ValidationError, match="run_name"):
            TrackingConfig(run_name=name)
        if name.strip():  # an override of blanks is YAML's null: no name, the generated id
            with pytest.raises(ConfigError, match=r"^invalid config: tracking\.run_name: "):
                resolve_config("rlve", "opd", overrides=[f"tracking.run_name={name}"])
    assert resolve_config("rlve", "opd", overrides=["tracking.run_name=my-run_2.b"]).tracking.run_name


def _make_run(runs_dir: Path, name: str) -> RunDir:
    run = RunDir.create(runs_dir, name)
    run.config.write_text("{}\n")
    return run


def test_find_takes_a_path_an_id_or_a_prefix_and_nothing_that_leaves_runs(tmp_path: Path) -> None:
    settings = Settings(workspace=tmp_path / "ws")
    inside = _make_run(settings.runs_dir, "20260101-rlve-opd-abcd")
    outside = _make_run(tmp_path, "elsewhere")  # a run directory outside the workspace
    assert RunDir.find(settings, str(inside.path)).path == inside.path
    assert RunDir.find(settings, "20260101-rlve-opd-abcd").path == inside.path
    assert RunDir.find(settings, "20260101").path == inside.path
    assert RunDir.find(settings, str(outside.path)).path == outside.path  # an explicit path is fine
    for ref in ("../elsewhere", "../*", "/x/y", "does-not-exist", "*", "2026010[1]"):
        with pytest.raises(RunRefused, match="no run") as refused:
            RunDir.find(settings, ref)
        assert "\n" not in str(refused.value), ref


def test_a_line_cut_short_by_a_kill_is_dropped_and_non_finite_values_come_back(tmp_path: Path) -> None:
    run = _make_run(tmp_path / "runs", "r")
    rows = [{"step": 1, "train/loss": 1.5, "kl/x": "nan"}, {"step": 2, "train/loss": 1.0}]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "train/lo')
    assert [r["step"] for r in run.metric_rows()] == [1, 2]
    points = run.metric_points()
    assert ("train/loss", 1.5, 1) in points and ("train/loss", 1.0, 2) in points
    [nan] = [p for p in points if p[0] == "kl/x"]
    assert nan[1] != nan[1] and nan[2] == 1  # NaN, at its step
    run.trim_metrics(1, 2)
    assert [json.loads(line) for line in run.metrics.read_text().splitlines()] == rows[:1]


def test_a_resume_from_the_last_steps_checkpoint_drops_the_final_eval_only(tmp_path: Path) -> None:
    """The final eval's lines sit at the last step but come after its checkpoint: the resume runs
    that eval again, so they go; the step's training line and earlier evals stay."""
    run = _make_run(tmp_path / "runs", "r")
    rows = [
        {"step": 0, "eval/rlve/accuracy": 0.1},
        {"step": 1, "train/loss": 1.5},
        {"step": 1, "eval/rlve/accuracy": 0.2},
        {"step": 2, "train/loss": 1.0},
        {"step": 2, "eval/rlve/accuracy": 0.3},
    ]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run.trim_metrics(2, 2)
    assert [json.loads(line) for line in run.metrics.read_text().splitlines()] == rows[:4]


def test_a_resume_drops_the_rows_of_the_step0_evals_it_runs_again(tmp_path: Path) -> None:
    """A run stopped inside the teacher's step-0 eval (the student's recorded): the teacher's rows
    go, the student's stay; stopped inside the student's, both go (`step0_evals_to_redo`)."""
    from distill.config import resolve_config
    from distill.run_eval import step0_evals_to_redo

    config = resolve_config("rlve", "opd", None, [])
    run = _make_run(tmp_path / "runs", "r")
    rows = [
        {"step": 0, "eval/rlve/accuracy": 0.1},
        {"step": 0, "teacher/eval/rlve/accuracy": 0.9},
        {"step": 0, "preflight/x": 1.0, "eval/other/accuracy": 0.5},
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    run.metrics.write_text(text)
    redo = step0_evals_to_redo({"student_before": {"accuracy": 0.1}}, config)
    assert redo == ("teacher/eval/",)
    run.trim_metrics(0, 2, redo)
    assert [json.loads(line) for line in run.metrics.read_text().splitlines()] == [rows[0], rows[2]]
    run.metrics.write_text(text)
    run.trim_metrics(0, 2, step0_evals_to_redo({}, config))
    assert [json.loads(line) for line in run.metrics.read_text().splitlines()] == [
        {"step": 0, "preflight/x": 1.0}
    ]
    assert step0_evals_to_redo(
        {}, config.model_copy(update={"eval": config.eval.model_copy(update={"eval_teacher": False})})
    ) == ("eval/",)
