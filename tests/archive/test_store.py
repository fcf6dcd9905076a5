"""`distill archive` against a local-folder remote: push, idempotence, ls, verify drift, pull; a
push never shrinks the archive; a dapo run on a user's data archives its prompts."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distill.cli.app import app

from .conftest import copy_run

pytestmark = pytest.mark.integration


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _remote_files(remote: Path) -> set[Path]:
    return {p for p in remote.rglob("*") if p.is_file()}


def test_push_records_hashes_and_is_idempotent(workspace: Path, tiny_run: Path) -> None:
    run_dir = copy_run(tiny_run, workspace)
    pushed = _cli("archive", "push")
    assert pushed.exit_code == 0, pushed.output
    assert f"{run_dir.name}: 5 outputs" in pushed.output

    # The workspace got its own DVC repository (it is not inside a git+DVC one) and a local remote.
    assert (workspace / ".dvc" / "config").exists()
    remote = workspace / "dvc-remote"
    for name in ("checkpoints", "data", "samples", "eval", "manifest.json"):
        assert (run_dir / f"{name}.dvc").exists(), name
    manifest = json.loads((run_dir / "manifest.json").read_text())
    outputs = manifest["archive"]["outputs"]
    assert set(outputs) == {"checkpoints", "data", "samples", "eval"}
    assert outputs["checkpoints"]["md5"].endswith(".dir") and outputs["checkpoints"]["size"] > 0
    assert set(manifest["checkpoint_hashes"]) == {"step-1", "step-2"}
    # The prompt sets the run trained and was evaluated on are part of its data.
    prompts = {p for p in manifest["data_hashes"] if p.startswith("prompts/")}
    assert any("-train-" in p for p in prompts) and any("-eval-" in p for p in prompts)
    assert manifest["archive"]["remote"] == str(remote.resolve())
    record = json.loads((run_dir / "archive.json").read_text())
    assert record["outputs"]["checkpoints"] == outputs["checkpoints"] and record["uploaded"] > 0

    # Every object in the remote is content-addressed by the recorded hashes.
    files = _remote_files(remote)
    names = {p.parent.name + p.name for p in files}
    for info in record["outputs"].values():
        assert info["md5"] in names

    # MLflow has the same hashes as tags, and the manifest as an artifact.
    from mlflow.tracking import MlflowClient

    summary = json.loads((run_dir / "summary.json").read_text())
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    tags = client.get_run(summary["mlflow_run_id"]).data.tags
    for name, info in record["outputs"].items():
        assert tags[f"archive.md5.{name}"] == info["md5"]
    assert tags["archive.remote"] == str(remote.resolve())

    # Pushing twice uploads nothing new and leaves the manifest byte-identical.
    before = (run_dir / "manifest.json").read_bytes()
    again = _cli("archive", "push", run_dir.name)
    assert again.exit_code == 0, again.output
    assert "0 files uploaded" in again.output
    assert (run_dir / "manifest.json").read_bytes() == before
    assert _remote_files(remote) == files
    # Without arguments only runs not yet archived are pushed.
    assert "nothing to archive" in _cli("archive", "push").output

    listed = _cli("archive", "ls", "--json")
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.output)
    assert row["run_id"] == run_dir.name and row["local"] is True
    assert row["size"] == sum(o["size"] for o in record["outputs"].values())
    assert run_dir.name in _cli("archive", "ls").output


def test_verify_reports_drift_and_pull_restores(workspace: Path, tiny_run: Path) -> None:
    run_dir = copy_run(tiny_run, workspace)
    assert _cli("archive", "push", run_dir.name).exit_code == 0
    ok = _cli("archive", "verify", run_dir.name)
    assert ok.exit_code == 0 and "verified" in ok.output, ok.output

    # Drift: a checkpoint file replaced by other bytes (replaced, not written through: it may be a
    # hardlink into the DVC cache) and a sample file gone.
    weights = run_dir / "checkpoints" / "step-2" / "model.safetensors"
    tmp = weights.with_suffix(".tmp")
    tmp.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    os.replace(tmp, weights)
    sample = next((run_dir / "samples").iterdir())
    sample.unlink()
    drift = _cli("archive", "verify", run_dir.name)
    assert drift.exit_code == 1, drift.output
    assert "modified: step-2/model.safetensors" in drift.output
    assert f"missing: {sample.name}" in drift.output
    assert "drift from the archived hashes" in drift.output

    # Local files that differ are not overwritten by a pull.
    refused = _cli("archive", "pull", run_dir.name)
    # Only the modified output blocks the pull; a missing file is what a pull restores.
    assert refused.exit_code == 2 and "local checkpoints differ from the archive" in refused.output

    # Delete the local copies and the cache: pull fetches from the remote and verifies.
    for name in ("checkpoints", "data", "samples", "eval"):
        shutil.rmtree(run_dir / name)
    shutil.rmtree(workspace / ".dvc" / "cache")
    pulled = _cli("archive", "pull", run_dir.name)
    assert pulled.exit_code == 0, pulled.output
    assert "verified" in pulled.output
    restored = run_dir / "checkpoints" / "step-2" / "model.safetensors"
    assert restored.read_bytes() == (tiny_run / "checkpoints" / "step-2" / "model.safetensors").read_bytes()
    assert _cli("archive", "verify", run_dir.name).exit_code == 0


def test_unfinished_or_unknown_runs_are_refused(workspace: Path, tiny_run: Path) -> None:
    run_dir = copy_run(tiny_run, workspace)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["status"] = "FAILED"
    (run_dir / "summary.json").write_text(json.dumps(summary))
    failed = _cli("archive", "push", run_dir.name)
    assert failed.exit_code == 2 and "is FAILED" in failed.output
    assert not (run_dir / "checkpoints.dvc").exists()
    unknown = _cli("archive", "verify", "no-such-run")
    assert unknown.exit_code == 2 and "no run 'no-such-run'" in unknown.output
    never = _cli("archive", "pull", run_dir.name)
    assert never.exit_code == 2 and "has not been archived" in never.output


def _git_dvc_project(root: Path, ignore_workspace: bool) -> Path:
    import subprocess

    from dvc.repo import Repo

    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    if ignore_workspace:
        (root / ".gitignore").write_text("/workspace/\n")
    Repo.init(str(root)).close()
    return root / "workspace"


def test_user_git_dvc_repo_is_used_unless_git_ignores_the_workspace(
    tmp_path: Path, tiny_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISTILL_REMOTE", str(tmp_path / "team-remote"))
    project = tmp_path / "project"
    ws = _git_dvc_project(project, ignore_workspace=False)
    monkeypatch.setenv("DISTILL_WORKSPACE", str(ws))
    run_dir = copy_run(tiny_run, ws)
    pushed = _cli("archive", "push", run_dir.name)
    assert pushed.exit_code == 0, pushed.output
    record = json.loads((run_dir / "archive.json").read_text())
    assert record["own_repo"] is False and record["dvc_root"] == str(project)
    assert not (ws / ".dvc").exists() and (run_dir / "checkpoints.dvc").exists()
    # Git tracks the .dvc files and ignores the data; the remote goes to the uncommitted local config.
    assert "/checkpoints" in (run_dir / ".gitignore").read_text()
    assert "team-remote" in (project / ".dvc" / "config.local").read_text()
    assert "team-remote" not in (project / ".dvc" / "config").read_text()
    assert any((tmp_path / "team-remote").rglob("*.dir"))

    ignored = _git_dvc_project(tmp_path / "ignored", ignore_workspace=True)
    monkeypatch.setenv("DISTILL_WORKSPACE", str(ignored))
    run_dir = copy_run(tiny_run, ignored)
    pushed = _cli("archive", "push", run_dir.name)
    assert pushed.exit_code == 0, pushed.output
    record = json.loads((run_dir / "archive.json").read_text())
    assert record["own_repo"] is True and record["dvc_root"] == str(ignored)
    assert (ignored / ".dvc" / "config").exists()


def test_pull_recreates_a_deleted_run_from_its_mlflow_record(
    workspace: Path, tiny_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = copy_run(tiny_run, workspace)
    # The run's MLflow store plays the team's tracking server.
    tracking_uri = json.loads((run_dir / "summary.json").read_text())["tracking_uri"]
    monkeypatch.setenv("DISTILL_TRACKING_URI", tracking_uri)
    assert _cli("archive", "push", run_dir.name).exit_code == 0
    record = json.loads((run_dir / "archive.json").read_text())
    # A new machine: no run directory, no DVC repository or cache; only MLflow and the remote.
    shutil.rmtree(run_dir)
    shutil.rmtree(workspace / ".dvc")
    pulled = _cli("archive", "pull", run_dir.name)
    assert pulled.exit_code == 0, pulled.output
    assert "re-created from MLflow run" in pulled.output and "verified" in pulled.output
    for name, info in record["outputs"].items():
        assert (run_dir / name).exists() and f"{name.split('.')[0]}" in pulled.output, name
        assert info["md5"] in pulled.output
    restored = run_dir / "checkpoints" / "step-2" / "model.safetensors"
    assert restored.read_bytes() == (tiny_run / "checkpoints" / "step-2" / "model.safetensors").read_bytes()
    assert (run_dir / "config.yaml").read_text() == (tiny_run / "config.yaml").read_text()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "FINISHED"
    assert _cli("archive", "verify", run_dir.name).exit_code == 0
    unknown = _cli("archive", "pull", "never-archived")
    assert unknown.exit_code == 2 and "no archived MLflow run" in unknown.output


def test_a_push_never_shrinks_the_archive(
    workspace: Path, tiny_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """push, delete the checkpoints here, push again: refused in one line (also to another remote);
    verify reads them MISSING and pull brings them back; a record a push once shrank (its
    `.dvc` file still there) is read whole by verify and pull."""
    run_dir = copy_run(tiny_run, workspace)
    assert _cli("archive", "push", run_dir.name).exit_code == 0
    record = json.loads((run_dir / "archive.json").read_text())
    shutil.rmtree(run_dir / "checkpoints")  # to free space, say
    refused = _cli("archive", "push", run_dir.name)
    assert refused.exit_code == 2, refused.output
    assert "checkpoints archived before but missing here" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert json.loads((run_dir / "archive.json").read_text()) == record  # nothing rewritten
    monkeypatch.setenv("DISTILL_REMOTE", str(workspace / "other-remote"))
    elsewhere = _cli("archive", "push", run_dir.name)
    assert elsewhere.exit_code == 2 and "checkpoints archived before" in elsewhere.output
    monkeypatch.delenv("DISTILL_REMOTE")

    drift = _cli("archive", "verify", run_dir.name)
    assert drift.exit_code == 1 and "MISSING" in drift.output, drift.output
    pulled = _cli("archive", "pull", run_dir.name)
    assert pulled.exit_code == 0 and "verified" in pulled.output, pulled.output
    weights = run_dir / "checkpoints" / "step-2" / "model.safetensors"
    assert weights.read_bytes() == (tiny_run / "checkpoints" / "step-2" / "model.safetensors").read_bytes()

    # The record a push that dropped the checkpoints wrote: verify and pull still read them from
    # the manifest and their `.dvc` file.
    shrunk = json.loads((run_dir / "archive.json").read_text())
    shrunk["outputs"].pop("checkpoints")
    (run_dir / "archive.json").write_text(json.dumps(shrunk))
    shutil.rmtree(run_dir / "checkpoints")
    drift = _cli("archive", "verify", run_dir.name)
    assert drift.exit_code == 1 and [
        line for line in drift.output.splitlines() if "checkpoints" in line and "MISSING" in line
    ]
    pulled = _cli("archive", "pull", run_dir.name)
    assert pulled.exit_code == 0, pulled.output
    assert weights.read_bytes() == (tiny_run / "checkpoints" / "step-2" / "model.safetensors").read_bytes()


FIXTURE = Path(__file__).parents[1] / "domains" / "dapo" / "fixtures" / "matharena_hub" / "train.jsonl"


def test_a_dapo_run_on_a_users_data_archives_its_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dapo run on a user's problems reads them from its file (no cached copy in the workspace):
    the archive still holds the exact items it trained and was evaluated on, written once."""
    import json

    import distill.domains
    from distill.archive.store import materialise_prompts
    from distill.config import resolve_config

    monkeypatch.setenv("DISTILL_WORKSPACE", str(tmp_path / "ws"))
    config = resolve_config(
        "dapo", "opd", None, [f"domain.data={FIXTURE}", "domain.eval_size=1", "domain.train_size=2"]
    )
    run_dir = tmp_path / "ws" / "runs" / "r1"
    run_dir.mkdir(parents=True)
    files = materialise_prompts(run_dir, config)
    key = config.domain.items_key()
    assert [p.name for p in files] == [f"dapo-eval-{key}.jsonl", f"dapo-train-{key}.jsonl"]
    rows = {p.name.split("-")[1]: [json.loads(line) for line in p.read_text().splitlines()] for p in files}
    assert len(rows["eval"]) == 1 and len(rows["train"]) == 2
    assert not {r["prompt"] for r in rows["eval"]} & {r["prompt"] for r in rows["train"]}

    def no_build(*args: object) -> None:
        raise AssertionError("the domain was built again")

    monkeypatch.setattr(distill.domains, "build_domain", no_build)
    assert materialise_prompts(run_dir, config) == files  # a second push finds them in the run
