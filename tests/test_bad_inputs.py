"""A sweep of bad inputs through the real CLI: each one is refused with exit code 2, exactly one
`error:` line on stderr naming the field or file at fault, no traceback, and nothing left behind
(no run directory, no zoo build, no eval output, no MLflow run left RUNNING).

Most cases run the typer app in-process (CliRunner: the same command functions, exit codes and
stderr as the console script, without paying Python's start-up per case); a few run
`python -m distill` in a subprocess to show the same on a real process's stderr. The cases
that import MLflow or rlve-gym are grouped at the end as slow.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distill.cli.app import app

RUN_A, RUN_B = "20260101-000000-rlve-opd-aaaa", "20260101-000000-rlve-opd-bbbb"


@dataclass(frozen=True)
class Files:
    """The workspace and the bad files the cases point at."""

    root: Path
    ws: Path
    zoo: Path

    def __call__(self, name: str) -> str:
        return str(self.root / name)

    def env(self) -> dict[str, str | None]:
        return {
            "DISTILL_WORKSPACE": str(self.ws),
            "DISTILL_ZOO_DIR": str(self.zoo),
            "DISTILL_TRACKING_URI": None,  # the workspace's own store
            "DISTILL_REMOTE": None,
            "HF_HUB_OFFLINE": "1",
            "COLUMNS": "200",
        }


def _write_run(ws: Path, name: str, config: bytes = b"domain: {name: rlve}\n") -> None:
    run = ws / "runs" / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_bytes(config)
    (run / "summary.json").write_text(json.dumps({"run_id": name, "status": "FINISHED", "domain": "rlve"}))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    root = tmp_path_factory.mktemp("bad-inputs")
    f = Files(root, root / "ws", root / "zoo")
    f.ws.mkdir()
    f.zoo.mkdir()
    for name in (RUN_A, RUN_B):  # one id prefix, two runs: ambiguous
        _write_run(f.ws, name)
    _write_run(f.ws, "latin1-config", config=b"domain: {name: rlve}\nnote: caf\xe9\n")
    texts = {
        "bad.yaml": "optim: {lr: [1, 2\n",
        "list.yaml": "- optim\n- rollout\n",
        "unknown-key.yaml": "optim:\n  nope: 1\n",
        "wrong-type.yaml": "rollout:\n  temperature: hot\n",
        "bad.json": '[{"problem": "1+1", "answer": "2"},',
        "bad.jsonl": '{"problem": "1+1", "answer": "2"}\n{"problem": \n',
        "no-answer.json": '[{"problem": "1+1"}]',
        "bad.parquet": "PAR1 this is not parquet",
        "not-a-model/notes.txt": "hello",
        "config-only/config.json": "{}",
        "a-file.bin": "weights?",
    }
    for name, text in texts.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "latin1.yaml").write_bytes(b"optim:\n  lr: 1e-4  # caf\xe9\n")
    (root / "latin1.jsonl").write_bytes(b'{"problem": "caf\xe9", "answer": "1"}\n')
    (root / "a-directory.yaml").mkdir()
    return f


def _leftovers(f: Files) -> dict[str, object]:
    """What a refused command must not have created: any file or folder under the fixture's root
    (runs, zoo entries, eval outputs, anything a bad path would reach), live MLflow runs."""
    db = f.ws / "mlflow.db"
    running = 0
    if db.exists():
        with sqlite3.connect(db) as con:
            running = con.execute("SELECT count(*) FROM runs WHERE status = 'RUNNING'").fetchone()[0]
    # The whole tree, not only runs/: a run name with a path in it would write beside them. The
    # store's own files change under reads (sqlite journals), so they count by RUNNING rows.
    paths = sorted(
        str(p.relative_to(f.root)) for p in f.root.rglob("*") if not p.name.startswith("mlflow.db")
    )
    return {"paths": paths, "running": running}


def _check_refused(stderr: str, code: int, needle: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr, stderr
    # One line and nothing else: not a second error, not a library's multi-line explanation.
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert needle in lines[0], (needle, lines[0])


Args = Callable[[Files], list[str]]

# (case id, arguments, what the error line must name). Fast: no MLflow, no torch, no model load.
FAST: list[tuple[str, Args, str]] = [
    # configs
    ("override-unknown-key", lambda f: ["run", "optim.nope=1"], "optim.nope"),
    ("override-wrong-type", lambda f: ["run", "optim.lr=fast"], "optim.lr"),
    ("override-out-of-range", lambda f: ["run", "optim.max_steps=0"], "optim.max_steps"),
    ("override-no-equals", lambda f: ["run", "optim.lr"], "optim.lr"),
    ("override-into-scalar", lambda f: ["run", "optim.lr.x=1"], "optim.lr"),
    ("override-unknown-section", lambda f: ["run", "nosuch.key=1"], "nosuch"),
    ("unknown-domain", lambda f: ["run", "--domain", "nope"], "'nope'"),
    ("unknown-method", lambda f: ["run", "--method", "nope"], "'nope'"),
    ("method-field-wrong-domain", lambda f: ["run", "--method", "rose", "method.student_turns=3"], "student_turns"),
    (
        "opsd-every-turn-single-turn",
        lambda f: ["run", "--method", "opsd", "method.privileged_every_turn=true"],
        "privileged_every_turn",
    ),
    (
        "sft-valid-turns-single-turn",
        lambda f: ["run", "--method", "sft", "method.valid_turns_only=true"],
        "valid_turns_only",
    ),
    (
        "rose-verified-single-turn",
        lambda f: ["run", "--method", "rose", "method.keep_verified_only=true"],
        "keep_verified_only",
    ),
    ("config-bad-yaml", lambda f: ["run", "--config", f("bad.yaml")], "bad.yaml"),
    ("config-not-utf8", lambda f: ["run", "--config", f("latin1.yaml")], "latin1.yaml"),
    ("config-missing", lambda f: ["run", "--config", f("missing.yaml")], "missing.yaml"),
    ("config-is-a-directory", lambda f: ["run", "--config", f("a-directory.yaml")], "a-directory.yaml"),
    ("config-top-level-list", lambda f: ["run", "--config", f("list.yaml")], "list.yaml"),
    ("config-unknown-key", lambda f: ["run", "--config", f("unknown-key.yaml")], "optim.nope"),
    ("config-wrong-type", lambda f: ["run", "--config", f("wrong-type.yaml")], "rollout.temperature"),
    ("run-name-traversal", lambda f: ["run", "tracking.run_name=../x"], "tracking.run_name"),
    ("opd-one-sample-per-prompt", lambda f: ["run", "rollout.num_generations=1"], "rollout.num_generations"),
    ("resume-with-options", lambda f: ["run", "--resume", RUN_A, "optim.lr=1"], "--resume"),
    ("resume-no-such-run", lambda f: ["run", "--resume", "nope"], "nope"),
    # models of a run: checked before a run directory or MLflow run exists
    ("student-missing-folder", lambda f: ["run", "--student", f("no-such-model")], "no-such-model"),
    ("student-not-a-model", lambda f: ["run", "--student", f("not-a-model")], "not-a-model"),
    ("student-no-tokenizer", lambda f: ["run", "--student", f("config-only")], "tokenizer"),
    ("student-is-a-file", lambda f: ["run", "--student", f("a-file.bin")], "a-file.bin"),
    ("teacher-unknown-zoo", lambda f: ["run", "--teacher", "zoo:nope"], "zoo:nope"),
    ("student-hub-id-offline", lambda f: ["run", "--student", "distill-test/no-such-model"], "no-such-model"),
    ("student-not-a-hub-id", lambda f: ["run", "--student", "bad id!"], "bad id!"),
    # eval: overrides, models, options, data files
    ("eval-training-override", lambda f: ["eval", "--model", "zoo:student", "optim.lr=1"], "optim.lr"),
    ("eval-unknown-domain-key", lambda f: ["eval", "--model", "zoo:student", "domain.nope=1"], "domain.nope"),
    ("eval-wrong-type", lambda f: ["eval", "--model", "zoo:student", "eval.k=many"], "eval.k"),
    ("eval-run-only-key", lambda f: ["eval", "--model", "zoo:student", "eval.every_steps=5"], "eval.every_steps"),
    ("eval-config-not-utf8", lambda f: ["eval", "--model", "zoo:student", "--config", f("latin1.yaml")], "latin1.yaml"),
    ("eval-model-missing", lambda f: ["eval", "--model", f("no-such-model")], "no-such-model"),
    ("eval-model-unknown-zoo", lambda f: ["eval", "--model", "zoo:nope"], "zoo:nope"),
    ("eval-model-not-a-model", lambda f: ["eval", "--model", f("not-a-model")], "not-a-model"),
    ("eval-model-hub-offline", lambda f: ["eval", "--model", "distill-test/no-such-model"], "no-such-model"),
    ("eval-n-zero", lambda f: ["eval", "--model", "zoo:student", "-n", "0"], "-n"),
    ("eval-data-without-benchmark", lambda f: ["eval", "--model", "zoo:student", "--data", f("bad.json")], "--benchmark"),
    ("eval-benchmark-wrong-domain", lambda f: ["eval", "--model", "zoo:student", "--benchmark", "aime25"], "--domain dapo"),
    # eval data files (dapo benchmark problems), read before any model is resolved
    ("eval-data-missing", lambda f: [*_dapo(f("missing.jsonl"))], "missing.jsonl"),
    ("eval-data-bad-json", lambda f: [*_dapo(f("bad.json"))], "bad.json"),
    ("eval-data-bad-jsonl", lambda f: [*_dapo(f("bad.jsonl"))], "bad.jsonl: line 2"),
    ("eval-data-not-utf8", lambda f: [*_dapo(f("latin1.jsonl"))], "latin1.jsonl: not UTF-8"),
    ("eval-data-bad-parquet", lambda f: [*_dapo(f("bad.parquet"))], "bad.parquet"),
    ("eval-data-row-without-answer", lambda f: [*_dapo(f("no-answer.json"))], "'answer'"),
    # tokenizer folders (bridge check)
    ("bridge-not-a-tokenizer", lambda f: ["bridge", "check", "--student", f("not-a-model"), "--teacher", "zoo:teacher"], "not-a-model"),
    ("bridge-missing-folder", lambda f: ["bridge", "check", "--student", "zoo:student", "--teacher", f("gone")], "gone"),
    ("bridge-unknown-zoo", lambda f: ["bridge", "check", "--student", "zoo:nope", "--teacher", "zoo:teacher"], "zoo:nope"),
    # run ids
    ("diagnose-no-such-run", lambda f: ["diagnose", "nope", "--no-plots", "--no-mlflow"], "nope"),
    ("diagnose-ambiguous-prefix", lambda f: ["diagnose", "20260101", "--no-plots", "--no-mlflow"], "ambiguous"),
    ("diagnose-absolute-path", lambda f: ["diagnose", "/x/y", "--no-plots", "--no-mlflow"], "/x/y"),
    ("diagnose-relative-outside", lambda f: ["diagnose", "../outside", "--no-plots", "--no-mlflow"], "../outside"),
    ("diagnose-config-not-utf8", lambda f: ["diagnose", "latin1-config", "--no-plots", "--no-mlflow"], "config.yaml"),
    ("diagnose-bad-format", lambda f: ["diagnose", RUN_A, "--format", "yaml"], "yaml"),
    ("compare-no-such-baseline", lambda f: ["compare", RUN_A, "--baseline", "nope", "--no-plot"], "nope"),
    ("runs-bad-sort", lambda f: ["runs", "--sort", "nope"], "--sort"),
    # a server's address, checked before vLLM is looked for
    ("serve-port-out-of-range", lambda f: ["serve", "teacher", "--port", "99999"], "--port 99999"),
    ("serve-unknown-host", lambda f: ["serve", "teacher", "--host", "no.such.host.invalid"], "--host"),
]  # fmt: skip

# Cases that need rlve-gym or an MLflow store (seconds to import and create).
SLOW: list[tuple[str, Args, str]] = [
    ("eval-unknown-environment", lambda f: ["eval", "--model", "zoo:student", "domain.environments=[Nope]"], "Nope"),
    ("archive-pull-quote-in-name", lambda f: ["archive", "pull", "x' OR name LIKE '%"], "x' OR name LIKE '%"),
    ("archive-pull-absolute-path", lambda f: ["archive", "pull", "/x/y"], "/x/y"),
    ("archive-pull-no-such-run", lambda f: ["archive", "pull", "nope"], "nope"),
    ("archive-pull-ambiguous", lambda f: ["archive", "pull", "20260101"], "ambiguous"),
    ("archive-verify-no-such-run", lambda f: ["archive", "verify", "nope"], "nope"),
    ("archive-push-no-such-run", lambda f: ["archive", "push", "/x/y"], "/x/y"),
    ("reproduce-no-such-run", lambda f: ["reproduce", "nope"], "nope"),
]  # fmt: skip


# What a run prepares before its first step (items generated or loaded, zoo models built) is its
# input: refused like a bad config, before the run directory exists (zoo/check.py build_inputs).
PREPARE: list[tuple[str, Args, str]] = [
    ("run-unknown-environment", lambda f: ["run", "domain.environments=[Nope]"], "Nope"),
    (
        "run-too-few-items",
        lambda f: ["run", "domain.environments=[TransmissionDelay]", "domain.parameters.TransmissionDelay.N=4",
                   "domain.eval_size=16"],
        "TransmissionDelay {'N': 4} (domain.parameters)",
    ),
    ("run-data-missing", lambda f: ["run", "--domain", "dapo", f"domain.data={f('missing.jsonl')}"], "missing.jsonl"),
    ("run-data-bad-jsonl", lambda f: ["run", "--domain", "dapo", f"domain.data={f('bad.jsonl')}"], "bad.jsonl: line 2"),
    ("run-data-no-answer", lambda f: ["run", "--domain", "dapo", f"domain.data={f('no-answer.json')}"], "'answer'"),
    ("run-data-bad-parquet", lambda f: ["run", "--domain", "dapo", f"domain.data={f('bad.parquet')}"], "bad.parquet"),
    (
        "run-eval-data-missing",
        lambda f: ["run", "--domain", "dapo", "domain.eval_benchmark=aime25", f"domain.eval_data={f('gone')}"],
        "gone",
    ),
    ("preflight-unknown-environment", lambda f: ["run", "--preflight", "domain.environments=[Nope]"], "Nope"),
    ("preflight-data-bad-json", lambda f: ["run", "--domain", "dapo", "--preflight", f"domain.data={f('bad.json')}"], "bad.json"),
]  # fmt: skip


def _dapo(data: str) -> list[str]:
    return ["eval", "--domain", "dapo", "--benchmark", "aime25", "--model", "zoo:student", "--data", data]


def _invoke(files: Files, args: list[str]) -> tuple[int, str, float]:
    start = time.perf_counter()
    result = CliRunner().invoke(app, args, env=files.env())
    seconds = time.perf_counter() - start
    # An exception the command did not turn into its one line is what a traceback would show.
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args}: {type(result.exception).__name__}: {result.exception}")
    return result.exit_code, result.stderr, seconds


@pytest.fixture
def untouched(files: Files) -> Iterator[None]:
    before = _leftovers(files)
    yield
    assert _leftovers(files) == before


def _params(cases: list[tuple[str, Args, str]]) -> list[object]:
    return [pytest.param(args, needle, id=case_id) for case_id, args, needle in cases]


@pytest.mark.parametrize(("args", "needle"), _params(FAST))
def test_refused_fast(files: Files, untouched: None, args: Args, needle: str) -> None:
    code, stderr, seconds = _invoke(files, args(files))
    _check_refused(stderr, code, needle)
    # Measured 0.01-0.4 s each (a first import of pyarrow or rlve-gym's data: ~2 s); the bound has
    # room for a loaded machine and still catches a zoo build or a model load (tens of seconds).
    assert seconds < 5.0, f"took {seconds:.1f} s"


@pytest.fixture(scope="module")
def mlflow_store(files: Files) -> str:
    """A store holding one finished, archived-looking run, so a run name really reaches MLflow."""
    from distill.settings import Settings
    from distill.tracking.mlflow import open_tracker

    settings = Settings(workspace=files.ws)
    tracker = open_tracker(settings.resolved_tracking_uri, "distill", settings.artifact_root, run_name="kept")
    tracker.set_tags({"archive.md5.checkpoints": "0" * 32})
    tracker.finish()
    return settings.resolved_tracking_uri


@pytest.mark.integration
@pytest.mark.parametrize(("args", "needle"), _params(SLOW))
def test_refused_slow(files: Files, mlflow_store: str, untouched: None, args: Args, needle: str) -> None:
    code, stderr, _ = _invoke(files, args(files))
    _check_refused(stderr, code, needle)


@pytest.mark.integration
@pytest.mark.parametrize(("args", "needle"), _params(PREPARE))
def test_refused_while_preparing(files: Files, untouched: None, args: Args, needle: str) -> None:
    code, stderr, _ = _invoke(files, args(files))
    _check_refused(stderr, code, needle)


@pytest.mark.integration
def test_a_zoo_that_cannot_be_built_is_refused(files: Files) -> None:
    # DISTILL_ZOO_DIR names a file: the zoo build cannot make its folder. No run, no zoo entry.
    env = {**files.env(), "DISTILL_ZOO_DIR": files("a-file.bin")}
    args = ["run", "domain.train_size=16", "domain.eval_size=8"]
    runs = sorted((files.ws / "runs").iterdir())
    for command in (args, [*args, "--preflight"]):
        result = CliRunner().invoke(app, command, env=env)
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
        _check_refused(result.stderr, result.exit_code, "a-file.bin")
    assert sorted((files.ws / "runs").iterdir()) == runs


def test_a_taken_port_is_refused(files: Files, untouched: None) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, stderr, _ = _invoke(files, ["serve", "teacher", "--port", port, "--dry-run"])
    _check_refused(stderr, code, f"--port {port}: cannot listen there")


# The same, on a real process: stderr as a user sees it, the console entry point, no traceback.
SUBPROCESS = [
    ("config-not-utf8", lambda f: ["run", "--config", f("latin1.yaml")], "latin1.yaml"),
    ("student-missing-folder", lambda f: ["run", "--student", f("no-such-model")], "no-such-model"),
    ("eval-override-unknown-key", lambda f: ["eval", "--model", "zoo:student", "domain.nope=1"], "domain.nope"),
    ("diagnose-absolute-path", lambda f: ["diagnose", "/x/y"], "/x/y"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "needle"), _params(SUBPROCESS))
def test_refused_by_the_real_process(files: Files, untouched: None, args: Args, needle: str) -> None:
    env = {k: v for k, v in {**os.environ, **files.env(), "OMP_NUM_THREADS": "1"}.items() if v is not None}
    proc = subprocess.run(
        [sys.executable, "-m", "distill", *args(files)], env=env, capture_output=True, text=True, timeout=60
    )
    _check_refused(proc.stderr, proc.returncode, needle)


def test_the_sweep_is_wide() -> None:
    assert len(FAST) + len(SLOW) + len(PREPARE) >= 50


# Bad records inside a workspace: a broken file is reported as such, the rest still reads.


def test_a_corrupt_summary_is_listed_and_hides_no_other_run(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _write_run(ws, "good-run")
    _write_run(ws, "torn-run")
    (ws / "runs" / "torn-run" / "summary.json").write_text('{"run_id": "torn-run", "status": "FINI')
    _write_run(ws, "bytes-run")
    (ws / "runs" / "bytes-run" / "summary.json").write_bytes(b'{"run_id": "caf\xe9"}')
    env = {"DISTILL_WORKSPACE": str(ws), "DISTILL_TRACKING_URI": None, "COLUMNS": "200"}
    table = CliRunner().invoke(app, ["runs"], env=env)
    assert table.exit_code == 0, table.output
    assert "good-run" in table.stdout and "FINISHED" in table.stdout
    assert "torn-run" in table.stdout and "bytes-run" in table.stdout and "UNREADABLE" in table.stdout
    assert "torn-run: summary.json unreadable (JSONDecodeError" in table.stdout
    listed = CliRunner().invoke(app, ["runs", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    rows = {row["run_id"]: row for row in json.loads(listed.stdout)}
    assert rows["good-run"]["status"] == "FINISHED"
    assert rows["torn-run"]["status"] == rows["bytes-run"]["status"] == "UNREADABLE"
    assert "summary.json unreadable" in rows["bytes-run"]["error"]
    only_broken = CliRunner().invoke(app, ["runs", "--status", "unreadable", "--json"], env=env)
    assert sorted(row["run_id"] for row in json.loads(only_broken.stdout)) == ["bytes-run", "torn-run"]


@pytest.mark.parametrize("step", ["1e30", "1e400", "-1e30", "99999999999999999999999"])
def test_a_huge_step_is_skipped_by_diagnose_and_compare(tmp_path: Path, step: str) -> None:
    ws = tmp_path / "ws"
    _write_run(ws, "huge-step")
    rows = [f'{{"step": {s}, "train/loss": {1.0 / s}}}' for s in (1, 2, 3)]
    rows.insert(1, f'{{"step": {step}, "train/loss": 0.5}}')
    (ws / "runs" / "huge-step" / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    env = {"DISTILL_WORKSPACE": str(ws), "DISTILL_TRACKING_URI": None, "COLUMNS": "200"}
    for args in (
        ["diagnose", "huge-step", "--no-plots", "--no-mlflow"],
        ["compare", "huge-step", "--no-plot"],
    ):
        result = CliRunner().invoke(app, args, env=env)
        assert not (result.exception and not isinstance(result.exception, SystemExit)), repr(result.exception)
        assert result.exit_code in (0, 1), result.output
    report = CliRunner().invoke(app, ["diagnose", "huge-step", "--no-plots", "--no-mlflow"], env=env).stdout
    assert "metrics.jsonl line 2" in report and "skipped" in report
