"""A run SIGKILLed during its step-0 evals (after the student's eval, inside the teacher's, or
between the parts of a mixed rlve+dapo eval) and resumed logs every step-0 point once, in
metrics.jsonl and in MLflow. The kill is sent by the run to itself, right after the named eval
row is written (a real SIGKILL at an exact moment), then `distill run --resume` continues it (in this process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from tiny_runs import tiny_run_overrides  # tests/ is on sys.path (rootdir conftest)

from .mlflow_level import assert_level

pytestmark = pytest.mark.integration

# `distill <args>`, killed (SIGKILL, by itself) once a step-0 row with a key under PREFIX is written.
KILLED_AT = textwrap.dedent(
    """
    import os, signal, sys
    from distill.tracking import steplog

    prefix = sys.argv[1]
    write = steplog.StepLog.write

    def write_then_die(self, step, metrics):
        write(self, step, metrics)
        if step == 0 and any(key.startswith(prefix) for key in metrics):
            os.kill(os.getpid(), signal.SIGKILL)

    steplog.StepLog.write = write_then_die
    sys.argv = ["distill", *sys.argv[2:]]
    from distill.cli.app import main
    main()
    """
)


def _env(ws: Path) -> dict[str, str]:
    return dict(
        os.environ,
        DISTILL_WORKSPACE=str(ws),
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
    )


def _run(argv: list[str], ws: Path, log: Path) -> int:
    with log.open("a") as out:
        proc = subprocess.run(
            argv,
            env=_env(ws),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
            # A process started from a background job inherits SIGINT ignored: give it the default.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    return proc.returncode


# (case, domain words, the key prefix whose step-0 row is the last thing the killed run writes)
# Killed inside the teacher's eval, the student's is done; between the parts of the student's
# mixed eval, nothing is done: each resume redoes exactly what was not recorded.
CASES = {
    "inside-teacher": (["--domain", "rlve"], "teacher/eval/"),
    "between-parts": (["--domain", "rlve,dapo"], "eval/rlve/"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_kill_during_the_step0_evals_logs_each_point_once(
    case: str, tiny_zoo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    domain, prefix = CASES[case]
    multi = "rlve,dapo" in domain
    args = ["run", *domain, "--method", "opd", *tiny_run_overrides(tiny_zoo, "victim", multi)]
    ws, log = tmp_path / "ws", tmp_path / "run.log"
    rc = _run([sys.executable, "-c", KILLED_AT, prefix, *args], ws, log)
    assert rc == -signal.SIGKILL, log.read_text()[-3000:]
    run_dir = ws / "runs" / "victim"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["step"] == 0 and any(k.startswith(prefix) for k in rows[-1]), rows
    if multi:  # killed between the parts: rlve's figures are written, dapo's not yet
        assert not any(k.startswith("eval/dapo/") for row in rows for k in row)

    from distill.runner import execute
    from distill.settings import get_settings

    monkeypatch.setenv("DISTILL_WORKSPACE", str(ws))
    summary = execute(
        None, get_settings(), argv=["distill", "run", "--resume", "victim"], resume="victim", say=print
    )
    assert summary["status"] == "FINISHED" and {"student_before", "teacher_score"} <= set(summary)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    points = Counter((key, row["step"]) for row in rows for key in row if key != "step")
    assert max(points.values()) == 1, [p for p, n in points.items() if n > 1]
    keys = {key for key, step in points if step == 0}
    expected = ["eval/rlve/accuracy", "teacher/eval/rlve/accuracy"]
    if multi:
        expected += ["eval/dapo/accuracy", "eval/rlve+dapo/accuracy", "teacher/eval/dapo/accuracy"]
        assert set(summary["parts"]) == {"rlve", "dapo"}
        assert all({"student_before", "teacher_score"} <= set(s) for s in summary["parts"].values())
    assert set(expected) <= keys, sorted(keys)
    from mlflow.tracking import MlflowClient

    # MLflow holds what metrics.jsonl holds, every point once.
    assert_level(MlflowClient(f"sqlite:///{(ws / 'mlflow.db').resolve()}"), run_dir)
