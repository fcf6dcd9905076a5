"""A run against a real `mlflow server` on loopback (`DISTILL_TRACKING_URI=http://...`): artifacts
go to the server's own (proxied) store, the UI hint is the server's URL, and a server that goes
down mid-run and comes back on the same port costs one warning and no metric point."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .mlflow_level import assert_level

pytestmark = pytest.mark.integration


class MlflowServer:
    """`mlflow server` in its own process group (it runs uvicorn and a job runner as children)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.artifacts = root / "artifacts"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180) -> None:
        command = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.root / 'db'}",
        ]
        command += ["--artifacts-destination", str(self.artifacts), "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--workers", "1"]
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"mlflow server did not start in {timeout} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=20)
                break
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue
        self.proc = None
        with socket.socket() as sock:  # the port is free again: nothing answers there
            assert sock.connect_ex(("127.0.0.1", self.port)) != 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()


def _outage(server: MlflowServer, down_at: int, up_at: int) -> Any:
    """A trainer callback that stops the server after step `down_at` and brings it back on the same
    port after step `up_at` (holding the step until it answers: the outage is deterministic)."""
    from transformers import TrainerCallback

    from distill.tracking.mlflow import FLUSH_INTERVAL_S

    class Outage(TrainerCallback):  # type: ignore[misc]
        stopped_at = 0.0

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == down_at:
                server.stop()
                self.stopped_at = time.monotonic()
            elif state.global_step == up_at:
                # Long enough down for the writer to have tried (and failed) more than once.
                time.sleep(max(0.0, self.stopped_at + 3 * FLUSH_INTERVAL_S - time.monotonic()))
                server.start()

    return Outage()


def test_run_against_a_server_that_goes_down_and_comes_back(
    server: MlflowServer, tiny_zoo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: Any
) -> None:
    from mlflow.tracking import MlflowClient

    from distill.cli.report import print_run_summary
    from distill.config import resolve_config
    from distill.runner import execute
    from distill.settings import Settings

    # A refused connection fails at once instead of after MLflow's minutes of retries.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    d = tiny_zoo.domain
    config = resolve_config(
        "rlve",
        "opd",
        overrides=[
            f"student.name={tiny_zoo.student}",
            f"teacher.name={tiny_zoo.teacher}",
            f"domain.train_size={d.train_size}",
            f"domain.eval_size={d.eval_size}",
            "optim.max_steps=10",
            "checkpoint.every_steps=2",
            "rollout.prompts_per_step=4",
            "rollout.max_new_tokens=16",
            "eval.items=4",
            "eval.max_new_tokens=8",
            "eval.eval_teacher=false",
            "tracking.run_name=served",
            "threads=1",
        ],
    )
    settings = Settings(workspace=tmp_path / "ws", tracking_uri=server.uri)
    summary = execute(config, settings, argv=["test"], say=lambda _: None, callbacks=[_outage(server, 3, 6)])
    err = capfd.readouterr().err
    assert summary["status"] == "FINISHED"
    assert err.count(f"tracking store {server.uri} unreachable") == 1, err[-3000:]
    assert f"tracking store {server.uri} reachable again" in err

    client = MlflowClient(tracking_uri=server.uri)
    run_dir = Path(summary["run_dir"])
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["checkpoint.last"].endswith("step-10")
    stored = assert_level(client, run_dir)  # no point lost to the outage, none sent twice
    assert sorted({s for k, s, _ in stored if k == "train/loss"}) == list(range(1, 11))

    # Artifacts went through the server into its own store, none into this workspace.
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.artifact_location.startswith("mlflow-artifacts:")
    listed = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "manifest.json", "preflight.json", "metrics.jsonl", "summary.json"} <= listed
    on_server = {p.name for p in server.artifacts.rglob("*") if p.is_file()}
    assert {"config.yaml", "metrics.jsonl", "summary.json"} <= on_server
    assert not (tmp_path / "ws" / "mlartifacts").exists()
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 10

    print_run_summary(summary, settings)
    out = capfd.readouterr().out
    assert f"open UI  {server.uri}" in out and "mlflow ui" not in out
