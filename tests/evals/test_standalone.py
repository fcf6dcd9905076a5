"""distill.evals.standalone: where an eval is logged."""

from __future__ import annotations

from pathlib import Path


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
