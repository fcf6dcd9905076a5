"""`distill run --domain sciworld`: the multi-turn methods and the episode eval on the run path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from distill.methods import get_method


def test_sciworld_methods_resolve_to_the_episode_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from distill import registry
    from distill.methods import episode_online, episode_sft, sft

    assert get_method("sft", "sciworld") is episode_sft.train
    assert get_method("rose", "sciworld") is episode_online.train_rose
    assert get_method("opd", "sciworld") is episode_online.train_opd
    assert get_method("opsd", "sciworld") is episode_online.train_opsd
    # Single-turn domains keep the single-turn methods.
    assert get_method("sft", "rlve") is sft.train
    # A method without an episode version is a clear error on an episodic domain.
    monkeypatch.setitem(
        registry.METHODS, "opsd", dataclasses.replace(registry.METHODS["opsd"], episodes=None)
    )
    with pytest.raises(
        ValueError, match=r"'opsd' does not run on the multi-turn domain 'sciworld'.*sft, opd, rose$"
    ):
        get_method("opsd", "sciworld")
    with pytest.raises(ValueError, match="unknown method 'dpo'"):
        get_method("dpo", "sciworld")


def _our_jvms(workspace: Path) -> list[int]:
    """Live java processes started with this test's workspace in their environment."""
    marker = f"DISTILL_WORKSPACE={workspace}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"java" in cmd.split(b"\0")[0] and marker in env:
            found.append(int(proc.name))
    return found


@pytest.mark.integration
def test_rose_run_end_to_end(tmp_path: Path, tiny_zoo: Any) -> None:
    ws = tmp_path / "ws"
    env = {**os.environ, "DISTILL_WORKSPACE": str(ws), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    args = [
        "run",
        "--domain",
        "sciworld",
        "--method",
        "rose",
        f"student.name={tiny_zoo.student}",
        f"teacher.name={tiny_zoo.teacher}",
        "domain.tasks=[4-2]",
        "domain.train_size=2",
        "domain.eval_size=2",
        "domain.pool_size=1",
        "domain.max_turns=3",
        "rollout.max_new_tokens=8",
        "eval.max_new_tokens=8",
        "method.teacher_max_tokens=8",
        "method.student_turns=1",
        "method.student_turns_min=null",
        "optim.max_steps=2",
        "rollout.prompts_per_step=2",
        "eval.items=2",
        "eval.eval_teacher=true",  # the preset leaves it off; the run path must still do it
        "checkpoint.every_steps=0",
        "threads=1",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "distill", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # The domain's pool is closed before the process exits: no JVM of this run is left.
    assert _our_jvms(ws) == []
    assert "student before: Score" in proc.stdout and "Pass(>0)" in proc.stdout

    (run_dir,) = [p for p in (ws / "runs").iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["domain"] == "sciworld"
    for key in ("student_before", "student_after", "teacher_score"):
        metrics = summary[key]
        assert metrics["items"] == 2 and metrics["failed"] == 0
        assert 0.0 <= metrics["pass_gt0"] <= 1.0 and 0.0 <= metrics["success"] <= metrics["pass_gt0"]
        assert 0.0 <= metrics["score"] <= 1.0 and 1 <= metrics["turns_mean"] <= 3
        assert "accuracy" not in metrics
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/sciworld/score" in r]
    assert [r["step"] for r in evals] == [0, 2]
    assert all("eval/sciworld/success" in r and "eval/sciworld/pass_gt0" in r for r in evals)
    assert any("teacher/eval/sciworld/score" in r for r in rows)
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    # ROSE on episodes: the student writes at most its one turn, the teacher the rest.
    assert all(r["env/student_turns_mean"] <= 1.0 for r in train_rows)
    assert all(r["env/teacher_turns_mean"] > 0.0 for r in train_rows)
    lines = [json.loads(line) for line in (run_dir / "eval" / "step-2.jsonl").read_text().splitlines()]
    assert lines[0]["metrics"]["score"] == summary["student_after"]["score"]
    episodes = lines[1:]
    assert len(episodes) == 2 and all(ep["id"].startswith("sciworld_") for ep in episodes)
    _diagnose_reads_the_record(run_dir)


def _diagnose_reads_the_record(run_dir: Path) -> None:
    """Diagnose on this real sciworld record: the eval rules read its headline (the episode
    score, no accuracy is logged) and item count, and every fix it names is an override the
    run's own config accepts (no single-turn knob such as method.prefix_tokens)."""
    import yaml

    from distill.config import RunConfig, set_dotted
    from distill.diagnose import diagnose, load_run
    from distill.diagnose.eval_rules import eval_items, headline

    rec = load_run(run_dir)
    score = headline(rec, "sciworld")
    assert score is not None and score.key == "eval/sciworld/score" and list(score.steps) == [0, 2]
    assert eval_items(rec, "sciworld", 2) == 2
    findings = diagnose(rec)
    assert not [f.title for f in findings if f.name.startswith("rule_crashed")]
    data = yaml.safe_load((run_dir / "config.yaml").read_text())
    for fix in (x for f in findings for x in f.fixes):
        set_dotted(data, fix.key.split("."), yaml.safe_load(fix.value))
    RunConfig.model_validate(data)


def test_sciworld_zoo_models_have_their_own_recipes() -> None:
    from distill.config import domain_config
    from distill.zoo.build import recipe_key
    from distill.zoo.recipes import RECIPES, recipes_for

    sw = recipes_for("sciworld")
    # Whole episodes (median 1.1k tokens, ~3k by turn 20) fit the context; single-turn stays 1024.
    assert sw["teacher"].max_positions >= 4096 and sw["student"].max_positions >= 4096  # type: ignore[union-attr]
    assert RECIPES["teacher"].max_positions == 1024  # type: ignore[union-attr]
    # Half of each episode is the same instruction: run once per step (docs/sciworld.md).
    assert sw["teacher"].share_prefix and sw["student"].share_prefix  # type: ignore[union-attr]
    # The teacher also reads detours (a mistaken action and the simulator's reply), so OPD's and
    # ROSE's teacher goes on from a student's mistakes; the student learns gold episodes only.
    assert sw["teacher"].detour_share == 1.0 and sw["student"].detour_share == 0.0  # type: ignore[union-attr]
    domain = domain_config("sciworld")
    assert (
        recipe_key("teacher", domain)
        == recipe_key("teacher", domain, sw)
        != recipe_key("teacher", domain, RECIPES)
    )
    # The context length is part of the cache key.
    longer = {**sw, "teacher": sw["teacher"].model_copy(update={"max_positions": 8192})}
    assert recipe_key("teacher", domain, longer) != recipe_key("teacher", domain, sw)
    # dapo builds from the shared recipes; rlve's own teacher trains fewer steps (make run's budget).
    assert recipes_for("dapo") == RECIPES
    rlve = recipes_for("rlve")
    assert {name for name in RECIPES if rlve[name] != RECIPES[name]} == {"teacher"}
    assert rlve["teacher"].steps < RECIPES["teacher"].steps  # type: ignore[union-attr]
