"""Re-create a run directory that is gone from this machine, from its MLflow record alone.

`archive push` leaves the content hashes of every output on the MLflow run (`archive.md5.*`) and
the remote's URL (`archive.remote`). From those, `.dvc` files are written again, DVC pulls the
outputs from the remote, and `config.yaml`, `summary.json` and `metrics.jsonl` come back from the run's MLflow
artifacts (or, for the config, from the pulled manifest). Only the MLflow store and the remote
are needed: a new machine, a deleted workspace, a colleague's run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from distill.archive.dvcrepo import ArchiveError
from distill.archive.manifest import read_manifest
from distill.archive.store import RECORD
from distill.tracking.mlflow import download_artifact, runs_named
from distill.tracking.rundir import RunDir, RunRefused, check_run_id

if TYPE_CHECKING:
    from distill.settings import Settings

TAG_PREFIX = "archive.md5."
SQLITE_PREFIX = "sqlite:///"


def check_restorable(run_id: str) -> None:
    """A run to re-create is named by its id: a path (or nothing) would put the restored folder
    outside the workspace's runs, so it is refused before MLflow or DVC is touched."""
    try:
        check_run_id(run_id)
    except RunRefused:
        raise ArchiveError(f"no run directory {run_id!r} here, and it is no run id to restore") from None


def find_archived_mlflow_run(uri: str, run_id: str) -> tuple[str, dict[str, str]]:
    """(MLflow run id, tags) of the archived run named `run_id` in the store at `uri`.

    The name is matched by `runs_named`, outside MLflow's filter language: a quote in it is text.
    """
    check_restorable(run_id)
    nothing = f"no run {run_id!r} in this workspace, and no archived MLflow run of that name in {uri}"
    db = uri[len(SQLITE_PREFIX) :].split("?", 1)[0] if uri.startswith(SQLITE_PREFIX) else None
    if db and not Path(db).exists():
        raise ArchiveError(nothing)  # asking would create an empty store just to find nothing in it
    archived = [r for r in runs_named(uri, run_id) if any(k.startswith(TAG_PREFIX) for k in r["tags"])]
    if not archived:
        raise ArchiveError(nothing)
    run = max(archived, key=lambda r: r["start_time"])
    return str(run["run_id"]), dict(run["tags"])


def restore_run_dir(settings: Settings, run_id: str) -> Path:
    """Write the `.dvc` files and `archive.json` of an archived run from its MLflow tags; returns
    the run directory, ready for `pull_run`."""
    uri = settings.resolved_tracking_uri
    mlflow_run_id, tags = find_archived_mlflow_run(uri, run_id)
    run = RunDir(settings.runs_dir / run_id)
    run.path.mkdir(parents=True, exist_ok=True)
    outputs = {
        key[len(TAG_PREFIX) :]: {"md5": value} for key, value in tags.items() if key.startswith(TAG_PREFIX)
    }
    for name, info in outputs.items():
        out = {"md5": info["md5"], "hash": "md5", "path": name}
        (run.path / f"{name}.dvc").write_text(yaml.safe_dump({"outs": [out]}, sort_keys=False))
    record = {
        "run_id": run_id,
        "remote_url": tags.get("archive.remote", ""),
        "dvc_root": tags.get("archive.dvc_root", ""),
        "pushed_at": "",
        "restored_from": f"MLflow run {mlflow_run_id}",
        "outputs": outputs,
        "mlflow_run_id": mlflow_run_id,
    }
    (run.path / RECORD).write_text(json.dumps(record, indent=2))
    for target in (run.config, run.summary, run.metrics):
        if not target.exists():
            download_artifact(uri, mlflow_run_id, target.name, target)
    return run.path


def finish_restore(run_dir: Path) -> None:
    """After the pull: `config.yaml` from the manifest when the MLflow artifact was out of reach."""
    run = RunDir(run_dir)
    if run.config.exists():
        return

    config = read_manifest(run_dir).get("config")
    if config is not None:
        run.config.write_text(yaml.safe_dump(config, sort_keys=False))
