"""dvc.yaml + params.yaml: the pipeline zoo -> run -> eval -> diagnose, run for real by `dvc repro`
on a copy of the repository with tiny parameters (tiny zoo models, 2 steps)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
STAGES = ["zoo", "run", "eval", "diagnose"]


def test_pipeline_is_zoo_run_eval_diagnose_driven_by_params() -> None:
    pipeline = yaml.safe_load((REPO / "dvc.yaml").read_text())
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert list(pipeline["stages"]) == STAGES
    # Each stage depends on what the previous one wrote.
    outs = {
        name: [next(iter(o)) if isinstance(o, dict) else o for o in stage.get("outs", [])]
        for name, stage in pipeline["stages"].items()
    }
    for before, after in zip(STAGES, STAGES[1:], strict=False):
        assert set(outs[before]) & set(pipeline["stages"][after]["deps"]), (before, after)
    # The embedded default: the zoo models, the preset's steps, a pinned seed and thread count.
    assert params["run"]["student"] == "zoo:student" and params["run"]["teacher"] == "zoo:teacher"
    preset = yaml.safe_load((REPO / "configs" / params["domain"] / f"{params['method']}.yaml").read_text())
    assert params["run"]["max_steps"] == preset["optim"]["max_steps"]
    assert isinstance(params["run"]["seed"], int) and params["run"]["threads"] >= 1


def _project(tmp_path: Path, tiny_zoo) -> Path:
    proj = tmp_path / "proj"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("distill", "configs"):
        shutil.copytree(REPO / folder, proj / folder, ignore=ignore)
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(REPO / name, proj / name)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    d = tiny_zoo.domain
    params["zoo"]["models"] = "tok-qwen"
    params["run"].update(
        student=str(tiny_zoo.student),
        teacher=str(tiny_zoo.teacher),
        max_steps=2,
        threads=1,
        overrides=(
            f"domain.train_size={d.train_size} domain.eval_size={d.eval_size} checkpoint.every_steps=1 "
            "rollout.prompts_per_step=4 rollout.num_generations=2 rollout.max_new_tokens=16 "
            "eval.items=8 eval.max_new_tokens=16"
        ),
    )
    params["eval"].update(items=8, max_new_tokens=16)
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # In its own process: dvc's logger keeps the stream of the first test that set it up in this
    # process, which pytest may have closed since.
    init = _dvc(["init", "--no-scm"], proj)
    assert init.returncode == 0, init.stderr[-2000:]
    return proj


def _dvc(args: list[str], proj: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("DISTILL_WORKSPACE", None)  # the stages set their own
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "dvc", *args], cwd=proj, env=env, capture_output=True, text=True, timeout=900
    )


@pytest.mark.integration
def test_dvc_repro_recreates_the_reference_run(tmp_path: Path, tiny_zoo) -> None:
    proj = _project(tmp_path, tiny_zoo)
    first = _dvc(["repro"], proj)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ws = proj / "reference"
    summary = json.loads((ws / "runs" / "reference" / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["steps"] == 2
    manifest = json.loads((ws / "runs" / "reference" / "manifest.json").read_text())
    assert manifest["config"]["seed"] == 0 and manifest["config"]["threads"] == 1
    assert (ws / "runs" / "reference" / "checkpoints" / "step-2" / "model.safetensors").exists()
    assert "accuracy" in (ws / "eval.txt").read_text()
    assert json.loads((ws / "diagnose.json").read_text())

    lock = yaml.safe_load((proj / "dvc.lock").read_text())
    assert list(lock["stages"]) == STAGES
    outs = {o["path"]: o for o in lock["stages"]["run"]["outs"]}
    assert outs["reference/runs/reference/checkpoints"]["md5"].endswith(".dir")
    assert outs["reference/runs/reference/summary.json"]["md5"]
    assert lock["stages"]["run"]["params"]["params.yaml"]["run"]["seed"] == 0

    # Nothing changed: a second repro runs nothing; the pipeline is up to date.
    second = _dvc(["repro"], proj)
    assert second.returncode == 0, second.stderr[-3000:]
    for stage in STAGES:
        assert f"Stage '{stage}' didn't change, skipping" in second.stdout
    status = _dvc(["status", "--json"], proj)
    assert status.returncode == 0 and json.loads(status.stdout) == {}
