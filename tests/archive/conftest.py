"""Archive fixtures: one real tiny finished run (made once, copied per test) and an S3-compatible
server (moto's server mode, a separate process on a free loopback port, started once)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tiny_runs import tiny_run_overrides  # tests/ is on sys.path (rootdir conftest)


def tiny_overrides(tiny_zoo, steps: int = 2) -> list[str]:
    d = tiny_zoo.domain
    return [
        f"student.name={tiny_zoo.student}",
        f"teacher.name={tiny_zoo.teacher}",
        f"domain.train_size={d.train_size}",
        f"domain.eval_size={d.eval_size}",
        f"optim.max_steps={steps}",
        "checkpoint.every_steps=1",
        "rollout.prompts_per_step=4",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=16",
        "eval.items=8",
        "eval.max_new_tokens=16",
        "threads=1",
    ]


def make_run(tiny_zoo, name: str, steps: int = 2) -> Path:
    """A finished tiny OPD run made in-process by `distill.runner.execute`, in the session workspace."""
    from distill.config import resolve_config
    from distill.runner import execute
    from distill.settings import get_settings

    config = resolve_config(
        "rlve", "opd", None, [*tiny_overrides(tiny_zoo, steps), f"tracking.run_name={name}"]
    )
    summary = execute(config, get_settings(), argv=["distill", "run", "(test)"], say=lambda _: None)
    assert summary["status"] == "FINISHED"
    return Path(summary["run_dir"])


@pytest.fixture(scope="session")
def tiny_run(tiny_zoo) -> Path:
    return make_run(tiny_zoo, "archive-source")


@pytest.fixture(scope="session")
def tiny_mixed_run(tiny_zoo) -> Path:
    """A finished tiny OPD run over rlve+dapo, a teacher named per domain (one step, two eval
    items per domain, no teacher eval)."""
    from distill.config import resolve_config
    from distill.runner import execute
    from distill.settings import get_settings

    overrides = tiny_run_overrides(tiny_zoo, "archive-mixed", mixed=True, eval_teacher=False)
    config = resolve_config("rlve,dapo", "opd", None, overrides)
    summary = execute(config, get_settings(), argv=["distill", "run", "(test)"], say=lambda _: None)
    assert summary["status"] == "FINISHED" and set(summary["parts"]) == {"rlve", "dapo"}
    return Path(summary["run_dir"])


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh workspace for one test (DISTILL_WORKSPACE), with no remote configured."""
    ws = tmp_path / "ws"
    (ws / "runs").mkdir(parents=True)
    monkeypatch.setenv("DISTILL_WORKSPACE", str(ws))
    monkeypatch.delenv("DISTILL_REMOTE", raising=False)
    return ws


def copy_run(run_dir: Path, workspace: Path) -> Path:
    """The run copied into `workspace`, so each test archives, deletes and restores its own files."""
    target = workspace / "runs" / run_dir.name
    shutil.copytree(run_dir, target)
    return target


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    process: subprocess.Popen

    def client(self, key: str, secret: str):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name="us-east-1",
        )


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    port = _free_port()
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        assert proc.poll() is None, f"moto server exited with {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("moto server did not start within 60 s")
    yield S3Server(endpoint, proc)
    proc.terminate()
    proc.wait(timeout=30)
    log.close()
