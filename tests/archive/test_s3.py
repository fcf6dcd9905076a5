"""`distill archive` against a real S3-compatible server (moto's server mode on loopback), through the
CLI in subprocesses: round trip with exact eval reproduction, a planted secret that must not leak,
and a push killed mid-upload that completes when run again."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import S3Server, copy_run

pytestmark = pytest.mark.integration

KEY_ID = "distill-test-key"
BUCKET = "distill-archive"


def _env(workspace: Path, server: S3Server, secret: str, prefix: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DISTILL_WORKSPACE=str(workspace),
        DISTILL_REMOTE=f"s3://{BUCKET}/{prefix}",
        AWS_ACCESS_KEY_ID=KEY_ID,
        AWS_SECRET_ACCESS_KEY=secret,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=server.endpoint,
        OMP_NUM_THREADS="1",
    )
    return env


def _distill(args: list[str], env: dict[str, str], log: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "distill", *args], env=env, capture_output=True, text=True, timeout=600
    )
    log.extend([proc.stdout, proc.stderr])
    return proc


def _keys(server: S3Server, secret: str, prefix: str) -> list[str]:
    client = server.client(KEY_ID, secret)
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/"):
        keys += [obj["Key"] for obj in page.get("Contents", [])]
    return keys


def _bucket(server: S3Server, secret: str) -> None:
    client = server.client(KEY_ID, secret)
    if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=BUCKET)


def _delete_local_copies(workspace: Path, run_dir: Path) -> None:
    for name in ("checkpoints", "data", "samples", "eval"):
        shutil.rmtree(run_dir / name)
    (run_dir / "manifest.json").unlink()
    shutil.rmtree(workspace / ".dvc" / "cache")


def test_s3_round_trip_reproduces_eval_and_leaks_no_secret(
    workspace: Path, tiny_run: Path, s3_server: S3Server
) -> None:
    env_secret = "planted-env-" + secrets.token_hex(12)
    config_secret = "planted-config-" + secrets.token_hex(12)
    _bucket(s3_server, env_secret)
    run_dir = copy_run(tiny_run, workspace)
    env = _env(workspace, s3_server, env_secret, "roundtrip")
    log: list[str] = []

    pushed = _distill(["archive", "push", run_dir.name], env, log)
    assert pushed.returncode == 0, pushed.stderr[-3000:]
    assert f"s3://{BUCKET}/roundtrip" in pushed.stdout
    record = json.loads((run_dir / "archive.json").read_text())
    keys = _keys(s3_server, env_secret, "roundtrip")
    assert len(keys) == record["uploaded"] > 0
    for info in record["outputs"].values():
        assert any(k.endswith(info["md5"][2:]) for k in keys), info

    # From here on the credentials come from DVC's local config (never committed), not the env.
    local_config = workspace / ".dvc" / "config.local"
    local_config.write_text(
        f"['remote \"distill\"']\n    access_key_id = {KEY_ID}\n    secret_access_key = {config_secret}\n"
    )
    env.pop("AWS_SECRET_ACCESS_KEY")
    again = _distill(["archive", "push", run_dir.name], env, log)
    assert again.returncode == 0 and "0 files uploaded" in again.stdout, again.stderr[-3000:]

    original = (tiny_run / "checkpoints" / "step-2" / "model.safetensors").read_bytes()
    _delete_local_copies(workspace, run_dir)
    pulled = _distill(["archive", "pull", run_dir.name], env, log)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert "verified" in pulled.stdout
    assert (run_dir / "checkpoints" / "step-2" / "model.safetensors").read_bytes() == original
    verified = _distill(["archive", "verify", run_dir.name], env, log)
    assert verified.returncode == 0, verified.stdout

    # The restored checkpoint loads with transformers and gives the run's final eval numbers exactly.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "step-2")
    assert sum(p.numel() for p in model.parameters()) > 0
    reproduced = _distill(["reproduce", run_dir.name, "--eval-only"], env, log)
    assert reproduced.returncode == 0, reproduced.stdout + reproduced.stderr[-3000:]
    assert "reproduced exactly" in reproduced.stdout and " NO" not in reproduced.stdout

    # The planted secrets are nowhere distill writes: manifest, records, .dvc files, DVC's repo
    # config and logs, the MLflow store (params, tags, artifacts), the remote, or the output.
    assert config_secret in local_config.read_text()  # the check below is not vacuous
    summary = json.loads((run_dir / "summary.json").read_text())
    store = Path(summary["tracking_uri"].removeprefix("sqlite:///"))
    candidates = [p for p in workspace.rglob("*") if p.is_file() and p != local_config]
    candidates += [store, *[p for p in (store.parent / "mlartifacts").rglob("*") if p.is_file()]]
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=summary["tracking_uri"]).get_run(summary["mlflow_run_id"])
    assert run.data.tags["archive.remote"] == f"s3://{BUCKET}/roundtrip"
    texts = [*log, json.dumps(run.data.params), json.dumps(run.data.tags)]
    client = s3_server.client(KEY_ID, env_secret)
    texts += [client.get_object(Bucket=BUCKET, Key=k)["Body"].read().decode("latin-1") for k in keys]
    for secret in (env_secret, config_secret):
        assert not [t for t in texts if secret in t]
        assert not [p for p in candidates if secret.encode() in p.read_bytes()]


def test_killed_push_completes_when_run_again(workspace: Path, tiny_run: Path, s3_server: S3Server) -> None:
    secret = "secret-" + secrets.token_hex(8)
    _bucket(s3_server, secret)
    run_dir = copy_run(tiny_run, workspace)
    # Enough objects that the upload takes seconds, so the kill lands in the middle of it.
    shards = run_dir / "checkpoints" / "step-2" / "shards"
    shards.mkdir()
    for i in range(240):
        (shards / f"shard-{i:03d}.bin").write_bytes(os.urandom(64 * 1024))
    env = _env(workspace, s3_server, secret, "interrupted")
    log: list[str] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "distill", "archive", "push", run_dir.name, "--jobs", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 240
    while time.time() < deadline and len(_keys(s3_server, secret, "interrupted")) < 5:
        assert proc.poll() is None, "the push ended before it could be interrupted"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = len(_keys(s3_server, secret, "interrupted"))
    assert 5 <= at_kill < 240, at_kill
    assert not (run_dir / "archive.json").exists()  # the push is not recorded as done

    resumed = _distill(["archive", "push", run_dir.name], env, log)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    record = json.loads((run_dir / "archive.json").read_text())
    assert 0 < record["uploaded"] < len(_keys(s3_server, secret, "interrupted"))
    assert _distill(["archive", "verify", run_dir.name], env, log).returncode == 0

    # The remote now holds everything: a restore from it alone is complete and verified.
    _delete_local_copies(workspace, run_dir)
    pulled = _distill(["archive", "pull", run_dir.name], env, log)
    assert pulled.returncode == 0 and "verified" in pulled.stdout, pulled.stdout + pulled.stderr[-3000:]
    assert len(list(shards.iterdir())) == 240
