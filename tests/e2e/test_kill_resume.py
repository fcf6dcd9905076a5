"""Kill/resume is exact: a `distill run` SIGKILLed at a random step (or in the middle of a
checkpoint save) and continued with `distill run --resume` ends with the same final weights, bit
for bit, as the same config run without interruption - for opd, rose (its per-micro-batch RNG
draws and a sampling teacher), sft and opsd with an EMA teacher (state outside the Trainer, saved
in each checkpoint). Real subprocesses, real checkpoints; the helpers are benchmarks/kill_resume.py's.
"""

from __future__ import annotations

import importlib.util
import random
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from .mlflow_level import assert_level

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "kill_resume.py"
STEPS = 6


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kill_resume_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_a_kill_moment_leaves_a_step_after_it(tmp_path: Path) -> None:
    """A 90 ms step once carried a kill drawn 178 ms after step 5 of 6 past the run's end (the run
    was FINISHED, so the resume had nothing to do): no drawn step is the last one, and the wait
    after the drawn step ends as soon as the next step's line is written."""
    bench = _bench()
    setup = bench.Setup("s", "t", steps=STEPS, every=2)
    steps = {
        bench.draw_moment(random.Random(seed), setup, save=False, resumable=True).step for seed in range(200)
    }
    assert steps == {3, 4}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    line = '{{"step": {}, "train/loss": 1.0}}\n'
    (run_dir / "metrics.jsonl").write_text(line.format(3) + line.format(4))
    began = time.monotonic()
    bench._wait_or_next_step(run_dir, bench.Moment("step", 3, 5.0))
    assert time.monotonic() - began < 1.0  # step 4 is already logged: no 5 s wait
    began = time.monotonic()
    bench._wait_or_next_step(run_dir, bench.Moment("step", 4, 0.2))
    assert time.monotonic() - began >= 0.2


# The kill lands inside a checkpoint save for the cases whose saved state is the point.
KINDS = {"opd": "step", "rose": "step", "sft": "save", "opsd-ema": "save"}


@pytest.mark.parametrize("case", list(KINDS))
def test_killed_and_resumed_run_ends_with_the_uninterrupted_weights(
    case: str, tiny_zoo, tmp_path: Path
) -> None:
    bench = _bench()
    d = tiny_zoo.domain
    setup = bench.Setup(
        str(tiny_zoo.student),
        str(tiny_zoo.teacher),
        steps=STEPS,
        every=2,
        extra=[f"domain.train_size={d.train_size}", f"domain.eval_size={d.eval_size}"],
    )
    seed = random.randrange(1 << 30)
    # Late enough that a complete checkpoint exists: the resume continues from it.
    moment = bench.draw_moment(random.Random(seed), setup, save=KINDS[case] == "save", resumable=True)
    why = f"{case}, killed {moment.describe()} (seed {seed})"
    # The uninterrupted run goes alongside the one that is killed (own workspaces, own processes).
    ref_ws, ws = tmp_path / "ref", tmp_path / "kill"
    reference = bench.start(setup.args(case, "ref"), ref_ws, tmp_path / "ref.log")
    victim = bench.start(setup.args(case, "victim"), ws, tmp_path / "victim.log")
    run_dir = ws / "runs" / "victim"
    killed = bench.kill_at(victim, run_dir, moment, timeout=300)
    assert killed, f"{why}: the run ended before the kill\n{(tmp_path / 'victim.log').read_text()[-2000:]}"
    assert bench.half_checkpoints(run_dir, case) == [], why
    assert reference.wait(timeout=300) == 0, (tmp_path / "ref.log").read_text()[-3000:]

    rc = bench.finish(["run", "--resume", "victim"], ws, tmp_path / "victim.log", timeout=300)
    assert rc == 0, f"{why}\n{(tmp_path / 'victim.log').read_text()[-3000:]}"
    assert "resuming victim from step-" in (tmp_path / "victim.log").read_text(), why
    final = bench.final_weights(run_dir, STEPS)
    assert final == bench.final_weights(ref_ws / "runs" / "ref", STEPS), f"{why}: final weights differ"
    from mlflow.tracking import MlflowClient

    # Every point of metrics.jsonl in MLflow once, whatever moment the kill hit.
    assert_level(MlflowClient(f"sqlite:///{(ws / 'mlflow.db').resolve()}"), run_dir)
    if case == "opsd-ema":
        # The EMA teacher travels with every checkpoint.
        for folder in sorted((run_dir / "checkpoints").glob("step-*")):
            assert (folder / "ema_teacher.safetensors").is_file(), folder


def test_an_alternating_mix_with_moments_per_domain_resumes_to_the_same_weights(
    tiny_zoo, tmp_path: Path
) -> None:
    """One domain a step, each with Adam moments of its own: the moments of every domain travel
    with each checkpoint, and a run killed in a checkpoint save ends as the uninterrupted one."""
    import torch

    from distill.domains.mixed import step_plan

    bench = _bench()
    models = {"rlve": str(tiny_zoo.teacher), "dapo": str(tiny_zoo.teacher)}
    sizes = [f"domain.parts.{d}.{f}" for d in models for f in ("train_size=8", "eval_size=2")]
    setup = bench.Setup(
        str(tiny_zoo.student),
        str(tiny_zoo.teacher),
        steps=STEPS,
        every=2,
        multi_student=str(tiny_zoo.student),
        multi_teachers=models,
        extra=["domain.train_size=16", "domain.mix.rlve=1", "domain.mix.dapo=2", *sizes],
    )
    seed = random.randrange(1 << 30)
    moment = bench.draw_moment(random.Random(seed), setup, save=True, resumable=True)
    why = f"killed {moment.describe()} (seed {seed})"
    ref_ws, ws = tmp_path / "ref", tmp_path / "kill"
    reference = bench.start(setup.args("opd-alternate", "ref"), ref_ws, tmp_path / "ref.log")
    victim = bench.start(setup.args("opd-alternate", "victim"), ws, tmp_path / "victim.log")
    run_dir = ws / "runs" / "victim"
    assert bench.kill_at(victim, run_dir, moment, timeout=300), (tmp_path / "victim.log").read_text()[-2000:]
    assert bench.half_checkpoints(run_dir, "opd-alternate") == [], why
    assert reference.wait(timeout=300) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    rc = bench.finish(["run", "--resume", "victim"], ws, tmp_path / "victim.log", timeout=300)
    assert rc == 0, f"{why}\n{(tmp_path / 'victim.log').read_text()[-3000:]}"
    assert bench.final_weights(run_dir, STEPS) == bench.final_weights(ref_ws / "runs" / "ref", STEPS), why
    # Each domain's moments have stepped on its own steps only (one shared state would count all).
    plan = step_plan({"rlve": 1 / 3, "dapo": 2 / 3}, STEPS)
    saved = torch.load(run_dir / "checkpoints" / f"step-{STEPS}" / "domain_moments.pt", weights_only=True)
    steps = {part: {float(s["step"]) for s in state.values()} for part, state in saved.items()}
    assert steps == {"rlve": {float(plan.count("rlve"))}, "dapo": {float(plan.count("dapo"))}}
