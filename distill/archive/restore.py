"""Re-create a run directory that is gone from this machine, from its MLflow record alone.

`archive push` leaves the content hashes of every output on the MLflow run (`archive.md5.*`) and
the remote's URL (`archive.remote`). From those, `.dvc` files are written again, DVC pulls the
outputs from the remote, and `config.yaml`, `summary.json` and `metrics.jsonl` come back from the run's MLflow
artifacts (or, for the config, from the pulled manifest). Only the MLflow store and the remote
are needed: a new machine, a deleted workspace, a colleague's run.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from distill.archive.dvcrepo import ArchiveError

if TYPE_CHECKING:
    from distill.settings import Settings

TAG_PREFIX = "archive.md5."


def find_archived_mlflow_run(settings: Settings, run_id: str) -> tuple[str, dict[str, str]]:
    """(MLflow run id, tags) of the archived run named `run_id` in the workspace's tracking store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=settings.resolved_tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    found = (
        client.search_runs(experiments, filter_string=f"attributes.run_name = '{run_id}'")
        if experiments
        else []
    )
    archived = [r for r in found if any(k.startswith(TAG_PREFIX) for k in r.data.tags)]
    if not archived:
        raise ArchiveError(
            f"no run {run_id!r} under {settings.runs_dir}, and no archived MLflow run of that name "
            f"in {settings.resolved_tracking_uri}"
        )
    run = max(archived, key=lambda r: r.info.start_time)
    return run.info.run_id, dict(run.data.tags)


def _download(client: Any, mlflow_run_id: str, name: str, target: Path) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = Path(client.download_artifacts(mlflow_run_id, name, tmp))
        except Exception:  # an artifact store this machine cannot reach: the manifest still has the config
            return False
        shutil.copyfile(path, target)
    return True


def restore_run_dir(settings: Settings, run_id: str) -> Path:
    """Write the `.dvc` files and `archive.json` of an archived run from its MLflow tags; returns
    the run directory, ready for `pull_run`."""
    from mlflow.tracking import MlflowClient

    from distill.archive.store import RECORD

    mlflow_run_id, tags = find_archived_mlflow_run(settings, run_id)
    run_dir = settings.runs_dir / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    outputs = {
        key[len(TAG_PREFIX) :]: {"md5": value} for key, value in tags.items() if key.startswith(TAG_PREFIX)
    }
    for name, info in outputs.items():
        out = {"md5": info["md5"], "hash": "md5", "path": name}
        (run_dir / f"{name}.dvc").write_text(yaml.safe_dump({"outs": [out]}, sort_keys=False))
    record = {
        "run_id": run_id,
        "remote_url": tags.get("archive.remote", ""),
        "dvc_root": tags.get("archive.dvc_root", ""),
        "pushed_at": "",
        "restored_from": f"MLflow run {mlflow_run_id}",
        "outputs": outputs,
        "mlflow_run_id": mlflow_run_id,
    }
    (run_dir / RECORD).write_text(json.dumps(record, indent=2))
    client = MlflowClient(tracking_uri=settings.resolved_tracking_uri)
    for name in ("config.yaml", "summary.json", "metrics.jsonl"):
        if not (run_dir / name).exists():
            _download(client, mlflow_run_id, name, run_dir / name)
    return run_dir


def finish_restore(run_dir: Path) -> None:
    """After the pull: `config.yaml` from the manifest when the MLflow artifact was out of reach."""
    if (run_dir / "config.yaml").exists():
        return
    from distill.archive.manifest import read_manifest

    config = read_manifest(run_dir).get("config")
    if config is not None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
