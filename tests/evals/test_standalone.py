"""distill.evals.standalone: where an eval is logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_eval_experiment_follows_the_training_run(tmp_path: Path) -> None:
    """An eval of a run's checkpoint goes to that run's experiment (so it can nest under it);
    any other model to "distill"; --experiment wins."""
    import yaml

    from distill.evals.standalone import eval_experiment, training_run

    run = tmp_path / "runs" / "r1"
    ckpt = run / "checkpoints" / "step-4"
    ckpt.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (run / "config.yaml").write_text(yaml.safe_dump({"tracking": {"experiment": "sweep-7"}}))
    found = training_run(str(ckpt))
    assert found is not None and found.path == run.resolve()
    assert eval_experiment(str(ckpt), None) == "sweep-7"
    assert eval_experiment(str(ckpt), "mine") == "mine"
    assert eval_experiment(str(tmp_path), None) == "distill"
    assert eval_experiment("zoo:teacher", None) == "distill"


def test_result_files_are_unique_per_evaluation(tmp_path: Path) -> None:
    """Every run's checkpoints are `step-N`: the per-item file names the run, and each evaluation
    (another protocol of the same model, or the same one again) gets a file of its own."""
    from distill.evals.standalone import result_file

    paths = []
    for run in ("r1", "r2"):
        ckpt = tmp_path / "runs" / run / "checkpoints" / "step-200"
        ckpt.mkdir(parents=True)
        (ckpt.parent.parent / "summary.json").write_text("{}")
        paths.append(result_file(tmp_path, str(ckpt), "aime25", 16))
    assert paths[0].name.startswith("aime25-r1-step-200-k16-")
    assert paths[1].name.startswith("aime25-r2-step-200-k16-")
    again = result_file(tmp_path, str(ckpt), "aime25", 16)
    assert len({*paths, again}) == 3 and again.parent == tmp_path / "evals"


@pytest.mark.integration
def test_two_runs_step_checkpoints_keep_their_own_results(tiny_zoo, tmp_path: Path) -> None:
    """Two runs' `step-2` evaluated one after the other: two files, each the artifact of its own
    MLflow run (before, the second overwrote the first)."""
    import shutil

    from mlflow.tracking import MlflowClient

    from distill.evals.standalone import EvalRequest, evaluate_model
    from distill.settings import Settings

    settings = Settings(workspace=tmp_path / "ws")
    d = tiny_zoo.domain
    outcomes = []
    for run in ("r1", "r2"):
        ckpt = settings.workspace / "runs" / run / "checkpoints" / "step-2"
        shutil.copytree(tiny_zoo.student, ckpt)
        (ckpt.parent.parent / "summary.json").write_text("{}")
        fields = {"train_size": d.train_size, "eval_size": d.eval_size}
        req = EvalRequest(
            model=str(ckpt), items=2 if run == "r1" else 3, max_new_tokens=4, domain_fields=fields
        )
        outcomes.append(evaluate_model(req, str(ckpt), settings, say=lambda _: None))
    first, second = outcomes
    assert first.out != second.out and first.out.exists() and second.out.exists()
    client = MlflowClient(settings.resolved_tracking_uri)
    for outcome, items in zip(outcomes, (2, 3), strict=True):
        assert json.loads(outcome.out.read_text().splitlines()[0])["metrics"]["items"] == items
        [artifact] = client.list_artifacts(outcome.mlflow_run_id, "eval")
        local = client.download_artifacts(
            outcome.mlflow_run_id, artifact.path, str(tmp_path / outcome.mlflow_run_id)
        )
        assert Path(local).read_text() == outcome.out.read_text()
