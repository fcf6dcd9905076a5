"""Kill/resume: SIGKILL `distill run` at random moments (some in the middle of a checkpoint save),
resume each with `distill run --resume`, and check what a user relies on:

- resumed: the resumed run FINISHED;
- bit-equal: its final `model.safetensors` is byte for byte the uninterrupted run's (same config);
- half checkpoints: `step-N` folders left incomplete by the kill (the rename is the commit point,
  so there should be none);
- MLflow = metrics.jsonl: the MLflow run holds every (key, step, value) of `metrics.jsonl`
  exactly once and nothing else (steps trained twice must not be logged twice).

    python benchmarks/kill_resume.py                     # 20 kills over opd, rose, sft, opsd-ema, opd-multi, opd-alternate
    python benchmarks/kill_resume.py --kills 4 --methods opd --json results.json

Models: `--student`/`--teacher` (default the embedded zoo's, built on first use in
DISTILL_ZOO_DIR). Every run is a fresh process with its own workspace under `--dir`.
`tests/e2e/test_kill_resume.py` uses the same helpers on the tests' tiny models.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from distill import registry

# Per case: the method and what makes it exercise its own state (RNG draws, EMA teacher, data).
CASES: dict[str, list[str]] = {
    "opd": ["--method", "opd"],
    # K drawn per sample, a sampling teacher, two micro-batches a step: ROSE's own RNG stream
    # and the torch stream both matter.
    "rose": [
        "--method",
        "rose",
        "method.prefix_tokens=8",
        "method.prefix_tokens_min=1",
        "method.teacher_max_tokens=8",
        "method.teacher_temperature=1.0",
        "optim.grad_accum=2",
        "rollout.prompts_per_step=2",
    ],
    "sft": ["--method", "sft", "method.keep_verified_only=false", "optim.batch_size=4"],
    "opsd-ema": ["--method", "opsd", "method.teacher_weights=ema", "method.ema_decay=0.5"],
    # One student, a teacher per domain (`--multi-teachers`; by default each domain's zoo teacher
    # of the mixed zoo): rows drawn from both domains, each scored by its own teacher.
    "opd-multi": ["--domain", "rlve,dapo", "--method", "opd"],
    # The same, one domain a step, each at its own lr with Adam moments of its own (kept outside
    # the Trainer's optimizer state, saved in each checkpoint).
    "opd-alternate": [
        "--domain",
        "rlve,dapo",
        "--method",
        "opd",
        "domain.alternate=true",
        "domain.optimizer_state=per_domain",
        "domain.lr.dapo=3e-4",
    ],
}
# What a complete checkpoint folder holds (any method; the EMA teacher only for opsd-ema).
CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pth",
    "trainer_state.json",
)


@dataclass
class Setup:
    student: str
    teacher: str
    steps: int = 6
    every: int = 1
    threads: int = 1
    extra: list[str] = field(default_factory=list)  # e.g. the tests' domain sizes
    # The multi-domain case's student and each domain's teacher.
    multi_student: str = "zoo:student"
    multi_teachers: dict[str, str] = field(
        default_factory=lambda: {"rlve": "zoo:teacher", "dapo": "zoo:teacher"}
    )

    def args(self, case: str, name: str) -> list[str]:
        method = CASES[case][CASES[case].index("--method") + 1]
        multi = "--domain" in CASES[case]
        if registry.method_entry(method).own_teacher:
            models = [f"student.name={self.student}"]
        elif multi:
            models = [f"student.name={self.multi_student}"]
            models += [f"teachers.{d}.name={m}" for d, m in self.multi_teachers.items()]
        else:
            models = [f"student.name={self.student}", f"teacher.name={self.teacher}"]
        return [
            "run",
            *([] if multi else ["--domain", "rlve"]),
            *CASES[case],
            *models,
            f"optim.max_steps={self.steps}",
            f"checkpoint.every_steps={self.every}",
            "rollout.num_generations=2",
            "rollout.max_new_tokens=16",
            "eval.items=2",
            "eval.max_new_tokens=16",
            "eval.eval_teacher=false",
            f"threads={self.threads}",
            f"tracking.run_name={name}",
            *self.extra,
        ] + ([] if "rollout.prompts_per_step=2" in CASES[case] else ["rollout.prompts_per_step=4"])


def env_for(workspace: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DISTILL_WORKSPACE=str(workspace),
        MLFLOW_DISABLE_TELEMETRY="true",
        DVC_NO_ANALYTICS="1",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        OMP_WAIT_POLICY="PASSIVE",
    )
    return env


def start(args: list[str], workspace: Path, log: Path) -> subprocess.Popen[bytes]:
    """`distill <args>` in its own session (so the kill reaches any child it started)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "distill", *args],
            env=env_for(workspace),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A process started from a background job inherits SIGINT ignored: give it the default.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )


def finish(args: list[str], workspace: Path, log: Path, timeout: float = 600) -> int:
    proc = start(args, workspace, log)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return -9


def _trained_steps(run_dir: Path) -> int:
    """The last step with a training line in metrics.jsonl (0 before the first)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = [json.loads(line)["step"] for line in lines if line.endswith("}") and '"train/loss"' in line]
    return max(steps, default=0)


@dataclass(frozen=True)
class Moment:
    """When to kill: `delay_s` after step `step`'s line is written (`kind` step), or after the
    trainer starts writing `checkpoint-<step>` (`kind` save)."""

    kind: str
    step: int
    delay_s: float

    def describe(self) -> str:
        where = f"step {self.step} logged" if self.kind == "step" else f"checkpoint-{self.step} begun"
        return f"{self.delay_s * 1000:.0f} ms after {where}"


def draw_moment(rng: random.Random, setup: Setup, save: bool, resumable: bool = False) -> Moment:
    """A random kill moment; `resumable`: late enough that a complete checkpoint exists (so the
    resume continues from one rather than starting over)."""
    saves = list(range(setup.every, setup.steps, setup.every))
    if save:
        return Moment(
            "save",
            rng.choice(saves[1:] if resumable and len(saves) > 1 else saves),
            rng.uniform(0.001, 0.040),
        )
    # At most the last step but one: a step's worth of work is left after the kill, so the kill
    # never lands after a short run has already finished (and marked itself so) but not yet exited.
    last = max(setup.steps - 2, 1)
    first = setup.every + 1 if resumable else 1
    return Moment("step", rng.randint(min(first, last), last), rng.uniform(0.0, 0.25))


def _wait_or_next_step(run_dir: Path, moment: Moment) -> None:
    """Sleep `moment.delay_s`, but no later than the next step's line (a fast step must not
    carry the kill past the rest of the run)."""
    until = time.monotonic() + moment.delay_s
    while time.monotonic() < until:
        if moment.kind == "step" and _trained_steps(run_dir) > moment.step:
            return
        time.sleep(min(0.005, max(until - time.monotonic(), 0.0)))


def kill_at(proc: subprocess.Popen[bytes], run_dir: Path, moment: Moment, timeout: float = 600) -> bool:
    """SIGKILL the run at `moment`; False when it ended first."""
    deadline = time.monotonic() + timeout
    save_dir = run_dir / "checkpoints" / f"checkpoint-{moment.step}"
    while proc.poll() is None and time.monotonic() < deadline:
        if moment.kind == "save":
            reached = save_dir.exists() or (run_dir / "checkpoints" / f"step-{moment.step}").exists()
        else:
            reached = _trained_steps(run_dir) >= moment.step
        if reached:
            _wait_or_next_step(run_dir, moment)
            break
        time.sleep(0.002 if moment.kind == "save" else 0.01)
    if proc.poll() is not None:
        return False
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return True


def half_checkpoints(run_dir: Path, case: str) -> list[str]:
    """`step-N` folders that lack a file or hold one that does not read back."""
    import torch
    from safetensors import safe_open

    need = CHECKPOINT_FILES + (("ema_teacher.safetensors",) if case == "opsd-ema" else ())
    need += ("domain_moments.pt",) if case == "opd-alternate" else ()
    bad = []
    for folder in sorted((run_dir / "checkpoints").glob("step-*")):
        try:
            missing = [name for name in need if not (folder / name).is_file()]
            if missing:
                raise OSError(f"missing {', '.join(missing)}")
            json.loads((folder / "trainer_state.json").read_text())
            for name in ("model.safetensors", "ema_teacher.safetensors"):
                if (folder / name).exists():
                    with safe_open(str(folder / name), "pt") as fh:
                        [fh.get_tensor(k) for k in fh.keys()]
            for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
                torch.load(folder / name, weights_only=False)
        except Exception as exc:  # any unreadable part makes the folder a half checkpoint
            bad.append(f"{folder.name}: {type(exc).__name__}: {exc}")
    return bad


def _point(key: str, step: int, value: Any) -> tuple[str, int, str]:
    number = float(value)  # metrics.jsonl writes non-finite values as strings
    return key, int(step), "nan" if math.isnan(number) else repr(number)


def mlflow_matches(run_dir: Path, workspace: Path) -> tuple[bool, str]:
    """Whether the run's MLflow history is exactly metrics.jsonl: every point once, no other."""
    from mlflow.tracking import MlflowClient

    from distill.tracking.mlflow import mlflow_metric_name

    summary = json.loads((run_dir / "summary.json").read_text())
    client = MlflowClient(tracking_uri=summary.get("tracking_uri") or f"sqlite:///{workspace / 'mlflow.db'}")
    want: Counter[tuple[str, int, str]] = Counter()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        step = row.pop("step")
        want.update(_point(mlflow_metric_name(k), step, v) for k, v in row.items())
    twice = [p for p, n in want.items() if n > 1]
    if twice:  # the file itself must hold each point once (a resume must not log a step again)
        return False, f"metrics.jsonl holds {len(twice)} points twice (e.g. {twice[:2]})"
    run = client.get_run(summary["mlflow_run_id"])
    got: Counter[tuple[str, int, str]] = Counter()
    for key in run.data.metrics:
        got.update(_point(key, m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
    if got == want:
        return True, ""
    extra, lost = got - want, want - got
    return False, f"{sum(extra.values())} extra (e.g. {list(extra)[:2]}), {sum(lost.values())} missing"


def final_weights(run_dir: Path, steps: int) -> bytes:
    return (run_dir / "checkpoints" / f"step-{steps}" / "model.safetensors").read_bytes()


@dataclass
class Outcome:
    case: str
    moment: str
    killed: bool
    resumed: bool
    bit_equal: bool
    half_checkpoints: list[str]
    mlflow_equal: bool
    mlflow_note: str
    seconds: float


def reference(setup: Setup, case: str, root: Path) -> Path:
    """The uninterrupted run of `case`: its run directory."""
    ws = root / f"ref-{case}"
    name = f"ref-{case}"
    rc = finish(setup.args(case, name), ws, root / f"ref-{case}.log")
    if rc != 0:
        raise RuntimeError(f"reference run {case} exited {rc}; see {root / f'ref-{case}.log'}")
    return ws / "runs" / name


def kill_and_resume(setup: Setup, case: str, moment: Moment, root: Path, tag: str, ref: Path) -> Outcome:
    """One run of `case`, SIGKILLed at `moment`, then `distill run --resume` until it finishes."""
    t0 = time.perf_counter()
    ws, name, log = root / tag, tag, root / f"{tag}.log"
    run_dir = ws / "runs" / name
    killed = kill_at(start(setup.args(case, name), ws, log), run_dir, moment)
    half = half_checkpoints(run_dir, case) if killed else []
    if killed:
        finish(["run", "--resume", name], ws, log)
    summary = (
        json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    )
    resumed = summary.get("status") == "FINISHED"
    equal = resumed and final_weights(run_dir, setup.steps) == final_weights(ref, setup.steps)
    mlflow_ok, note = mlflow_matches(run_dir, ws) if resumed else (False, "not finished")
    return Outcome(
        case, moment.describe(), killed, resumed, equal, half, mlflow_ok, note, time.perf_counter() - t0
    )


def print_table(outcomes: list[Outcome]) -> None:
    header = f"{'case':<9} {'killed at':<34} {'resumed':>7} {'bit-equal':>9} {'half ckpt':>9} {'mlflow=jsonl':>12} {'s':>5}"
    print(header)
    print("-" * len(header))
    for o in outcomes:
        mark = "yes" if o.mlflow_equal else "NO"
        print(
            f"{o.case:<9} {o.moment if o.killed else 'ended before the kill':<34} "
            f"{'yes' if o.resumed else 'NO':>7} {'yes' if o.bit_equal else 'NO':>9} "
            f"{len(o.half_checkpoints):>9} {mark:>12} {o.seconds:>5.0f}"
        )
    # A run that ended before its kill moment counts against every column: it proves nothing.
    killed = [o for o in outcomes if o.killed]
    n = len(outcomes)
    print("-" * len(header))
    print(
        f"{len(killed)}/{n} kills landed: resumed {sum(o.resumed for o in killed)}/{n}, bit-equal "
        f"{sum(o.bit_equal for o in killed)}/{n}, half checkpoints taken "
        f"{sum(len(o.half_checkpoints) for o in killed)}, MLflow = metrics.jsonl "
        f"{sum(o.mlflow_equal for o in killed)}/{n}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--methods", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=1, help="checkpoint.every_steps")
    parser.add_argument("--student", default="zoo:student")
    parser.add_argument("--teacher", default="zoo:teacher")
    parser.add_argument("--multi-student", default="zoo:student", help="opd-multi's student")
    parser.add_argument(
        "--multi-teachers",
        default="rlve=zoo:teacher,dapo=zoo:teacher",
        help="opd-multi's teachers, domain=model",
    )
    parser.add_argument("--seed", type=int, default=0, help="draws the kill moments")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the workspaces go (default: a temp dir)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the outcomes as JSON here")
    opts = parser.parse_args()
    cases = opts.methods.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    setup = Setup(opts.student, opts.teacher, opts.steps, opts.every, multi_student=opts.multi_student)
    setup.multi_teachers = dict(pair.split("=", 1) for pair in opts.multi_teachers.split(","))
    root = opts.dir or Path(tempfile.mkdtemp(prefix="kill-resume-"))
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(opts.seed)
    refs = {case: reference(setup, case, root) for case in cases}
    outcomes = []
    for i in range(opts.kills):
        case = cases[i % len(cases)]
        # Every other kill lands inside a checkpoint save (the trainer writing checkpoint-N).
        moment = draw_moment(rng, setup, save=i % 2 == 1)
        outcome = kill_and_resume(setup, case, moment, root, f"kill-{i:02d}-{case}", refs[case])
        outcomes.append(outcome)
        print(
            f"[{i + 1}/{opts.kills}] {case}: {outcome.moment}: resumed {outcome.resumed}, "
            f"bit-equal {outcome.bit_equal}, mlflow {outcome.mlflow_equal} {outcome.mlflow_note}",
            flush=True,
        )
    print_table(outcomes)
    if opts.json:
        opts.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    print(f"workspaces and logs: {root}")


if __name__ == "__main__":
    main()
