"""`distill archive push | pull | ls | verify`: a run's checkpoints, data, samples, evals and manifest
in DVC-managed storage, pushed to a DVC remote, verified by content hash.

What a run archives (each a DVC output with its own `.dvc` file beside it in the run directory):
`checkpoints/`, `data/` (teacher trajectories and the materialised prompt sets the run trained and
was evaluated on, copied into `data/prompts/`), `samples/`, `eval/`, and last `manifest.json`,
which by then carries the hashes of the others. After a successful push `archive.json` records
the remote and the hashes; the same hashes go onto the MLflow run as `archive.*` tags.

A push killed mid-upload leaves the `.dvc` files and the cache complete (DVC writes them before
uploading) and no `archive.json`: running it again uploads what the remote lacks and records it.

A push never shrinks what a run's archive holds: an output that was archived (in `archive.json`,
the manifest's `archive.outputs`, or with a `.dvc` file beside it) and is missing here refuses the
push (pull it first), also when the push goes to another remote. `verify` and `pull` read the same
union, so an output deleted here reads MISSING and a pull restores it.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.archive.dvcrepo import ArchiveError, ArchiveRepo
from distill.archive.hashing import (
    checkpoint_hashes,
    content_md5,
    diff_listings,
    dir_listing,
    listing_md5,
    read_listing,
)
from distill.archive.manifest import read_manifest, update_manifest
from distill.archive.tagger import MlflowTagger
from distill.config import load_run_config
from distill.settings import get_settings
from distill.tracking.rundir import RunDir, live_status

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.settings import Settings

DIRS = (RunDir.CHECKPOINTS, RunDir.DATA, RunDir.SAMPLES, RunDir.EVAL)
MANIFEST = RunDir.MANIFEST
RECORD = "archive.json"
# Outputs the runner may write again (a resumed run re-evaluates and re-samples): plain copies,
# never hardlinks into the cache, so such a write cannot alter archived content.
MUTABLE = (RunDir.DATA, RunDir.SAMPLES, RunDir.EVAL, MANIFEST)


def read_record(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / RECORD
    return json.loads(path.read_text()) if path.exists() else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _run_config(run_dir: Path) -> RunConfig:
    return load_run_config(RunDir(run_dir).config)


def materialise_prompts(run_dir: Path, config: RunConfig) -> list[Path]:
    """The prompt sets the run trained and was evaluated on, in `<run>/data/prompts/` as
    `<domain>-<split>-<key>.jsonl`: copied from the workspace's materialised items
    (`<workspace>/data/`, where `distill.domains.base.cached_items` files them) when it has them,
    else written from the domain, built once (a dapo run on a user's data or a benchmark, whose
    items are read from their source rather than cached; a mixed run's eval items; a workspace
    that lost its files). A set already in the run is kept: a second push builds nothing."""
    data_dir = get_settings().workspace / "data"
    name, key = config.domain.name, config.domain.items_key()
    target = RunDir(run_dir).data / "prompts"
    target.mkdir(parents=True, exist_ok=True)
    for src in sorted(data_dir.glob(f"{name}-*-{key}.jsonl")):
        dest = target / src.name
        if not dest.exists():
            _copy_in(run_dir, dest, src.read_text())
    wanted = {split: target / f"{name}-{split}-{key}.jsonl" for split in ("train", "eval")}
    missing = {split: dest for split, dest in wanted.items() if not dest.exists()}
    if missing:
        from distill.domains import build_domain

        domain = build_domain(config.domain)
        try:
            for split, dest in missing.items():
                items = domain.train_items() if split == "train" else domain.eval_items()
                _copy_in(run_dir, dest, "".join(json.dumps(asdict(item)) + "\n" for item in items))
        finally:
            domain.close()
    return sorted(target.glob("*.jsonl"))


def _copy_in(run_dir: Path, dest: Path, text: str) -> None:
    tmp = run_dir / f".{dest.name}.tmp"  # outside data/: a killed copy is never archived
    tmp.write_text(text)
    os.replace(tmp, dest)


def _output_info(stage: Any) -> tuple[str, dict[str, Any]]:
    out = stage.outs[0]
    return Path(out.fs_path).name, {
        "md5": out.hash_info.value,
        "size": out.meta.size,
        "nfiles": out.meta.nfiles,
    }


def _cached_listing(archive: ArchiveRepo, md5: str) -> list[dict[str, str]] | None:
    return read_listing(Path(archive.repo.cache.local.oid_to_path(md5)))


def _unprotect(archive: ArchiveRepo, run_dir: Path, names: list[str]) -> None:
    for name in names:
        path = run_dir / name
        if name in MUTABLE and path.exists():
            archive.repo.unprotect(str(path))


def mlflow_tags(record: dict[str, Any]) -> dict[str, str]:
    tags = {"archive.remote": record["remote_url"], "archive.dvc_root": record["dvc_root"]}
    for name, info in record["outputs"].items():
        tags[f"archive.md5.{name}"] = info["md5"]
    return tags


def mlflow_tagger(run_dirs: list[Path], default_uri: str) -> MlflowTagger:
    """The MLflow tagging process for these runs' stores (and the workspace's, where unnamed runs
    usually live), started now so it is ready when DVC is done."""

    summaries = [RunDir(d).read_summary() for d in run_dirs]
    uris = [str(s["tracking_uri"]) for s in summaries if s.get("mlflow_run_id") and s.get("tracking_uri")]
    if (
        not uris
        and default_uri.startswith("sqlite:///")
        and not Path(default_uri[len("sqlite:///") :]).exists()
    ):
        return MlflowTagger([])  # no store to warm up (and none to create by opening it)
    return MlflowTagger(uris or [default_uri])


def _tag_mlflow(run_dir: Path, record: dict[str, Any], tagger: MlflowTagger | None) -> str:
    """Hashes and remote as tags on the run's MLflow run, the updated manifest as its artifact."""

    summary = RunDir(run_dir).read_summary()
    run_id, uri = summary.get("mlflow_run_id"), summary.get("tracking_uri")
    if not run_id or not uri:
        return "no MLflow run recorded in summary.json"
    # No tagger given: an empty one starts a child for this run's store (MlflowTagger.tag).
    with contextlib.nullcontext(tagger) if tagger is not None else MlflowTagger([]) as active:
        active.tag(str(uri), str(run_id), mlflow_tags(record), run_dir / MANIFEST)
    return f"MLflow run {run_id}"


def _check_finished(run_dir: Path) -> None:

    status = live_status(RunDir(run_dir).read_summary())
    if status != "FINISHED":
        raise ArchiveError(
            f"run {run_dir.name} is {status}; only FINISHED runs are archived (its files may still change)"
        )


@dataclass
class PushResult:
    run_id: str
    uploaded: int
    record: dict[str, Any]
    mlflow: str


def _refuse_shrinking(run_dir: Path) -> None:
    """A push rewrites `archive.json` and the manifest from the outputs present: one archived
    before and missing here would silently leave the archive's record."""
    missing = [name for name in archived_names(run_dir) if not (run_dir / name).exists()]
    if missing:
        raise ArchiveError(
            f"run {run_dir.name}: {', '.join(missing)} archived before but missing here; a push would drop "
            f"{'them' if len(missing) > 1 else 'it'} from the archive (distill archive pull {run_dir.name} first)"
        )


def push_run(
    archive: ArchiveRepo, run_dir: Path, jobs: int | None = None, tagger: MlflowTagger | None = None
) -> PushResult:
    _check_finished(run_dir)
    _refuse_shrinking(run_dir)
    config = _run_config(run_dir)
    manifest = read_manifest(run_dir)
    materialise_prompts(run_dir, config)
    targets = [str(run_dir / name) for name in DIRS if (run_dir / name).is_dir()]
    outputs = dict(_output_info(stage) for stage in archive.repo.add(targets))
    hashes: dict[str, Any] = {}
    if "checkpoints" in outputs:
        listing = _cached_listing(archive, outputs["checkpoints"]["md5"]) or []
        hashes["checkpoint_hashes"] = checkpoint_hashes(listing)
    if "data" in outputs:
        listing = _cached_listing(archive, outputs["data"]["md5"]) or []
        hashes["data_hashes"] = {row["relpath"]: row["md5"] for row in listing}
    section = {"remote": archive.remote_url, "dvc_root": str(archive.root), "outputs": outputs}
    # Nothing time-dependent goes in: an unchanged run yields a byte-identical manifest (idempotent).
    if any(manifest.get(k) != v for k, v in {**hashes, "archive": section}.items()):
        update_manifest(run_dir, {**hashes, "archive": section})
    name, info = _output_info(archive.repo.add([str(run_dir / MANIFEST)])[0])
    outputs = {**outputs, name: info}
    _unprotect(archive, run_dir, list(outputs))
    uploaded = archive.repo.push(
        targets=[str(run_dir / name) for name in outputs], remote=archive.remote, jobs=jobs
    )
    record = {
        "run_id": run_dir.name,
        "remote": archive.remote,
        "remote_url": archive.remote_url,
        "dvc_root": str(archive.root),
        "own_repo": archive.own,
        "pushed_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "uploaded": uploaded,
        "outputs": outputs,
        "mlflow_run_id": manifest.get("mlflow_run_id"),
    }
    mlflow = _tag_mlflow(run_dir, record, tagger)
    _write_json(run_dir / RECORD, record)
    return PushResult(run_dir.name, uploaded, record, mlflow)


def unarchived_runs(settings: Settings, remote_url: str) -> list[Path]:
    """FINISHED runs with no completed push to `remote_url`."""

    runs = [run.path for run in RunDir.all(settings)]
    out = []
    for run_dir in runs:
        if live_status(RunDir(run_dir).read_summary()) != "FINISHED" or not (run_dir / MANIFEST).exists():
            continue
        record = read_record(run_dir)
        if record is None or record.get("remote_url") != remote_url:
            out.append(run_dir)
    return out


@dataclass
class Check:
    """One archived output: the hash recorded at push time against the files on disk now."""

    name: str
    recorded: str
    actual: str | None
    dvc: str | None
    details: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.actual == self.recorded and self.dvc == self.recorded


def _dvcfile_md5(path: Path) -> str | None:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
        return str(data["outs"][0]["md5"])
    except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError):
        return None


def archived_names(run_dir: Path) -> list[str]:
    """Every output the run's archive holds by any record here: `archive.json`, the manifest's
    `archive.outputs`, a `.dvc` file."""
    names = set(_dvcfile_outputs(run_dir))
    record = read_record(run_dir)
    if record is not None:
        names.update(record["outputs"])
    names.update(_manifest_outputs(run_dir))
    return [name for name in (*DIRS, MANIFEST) if name in names]


def _manifest_outputs(run_dir: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((run_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    outputs = manifest.get("archive", {}).get("outputs", {}) if isinstance(manifest, dict) else {}
    return dict(outputs) if isinstance(outputs, dict) else {}


def _dvcfile_outputs(run_dir: Path) -> dict[str, dict[str, Any]]:
    found = {name: _dvcfile_md5(run_dir / f"{name}.dvc") for name in (*DIRS, MANIFEST)}
    return {name: {"md5": md5} for name, md5 in found.items() if md5 is not None}


def recorded_outputs(run_dir: Path) -> dict[str, dict[str, Any]]:
    """What was archived: every output any record here names (`archived_names`), with the hash
    the completed push recorded (archive.json), else the manifest's, else its `.dvc` file's."""
    record = read_record(run_dir)
    sources = [
        record["outputs"] if record is not None else {},
        _manifest_outputs(run_dir),
        _dvcfile_outputs(run_dir),
    ]
    outputs = {}
    for name in archived_names(run_dir):
        outputs[name] = dict(next(source[name] for source in sources if name in source))
    if not outputs:
        raise ArchiveError(f"run {run_dir.name} has not been archived (no {RECORD}, no archive record)")
    return outputs


def verify_run(archive: ArchiveRepo | None, run_dir: Path) -> list[Check]:
    """Re-hash every archived file and compare with the recorded hashes and the `.dvc` files."""
    checks = []
    for name, info in recorded_outputs(run_dir).items():
        path = run_dir / name
        check = Check(name, str(info["md5"]), None, _dvcfile_md5(run_dir / f"{name}.dvc"))
        if path.is_dir():
            listing = dir_listing(path)
            check.actual = listing_md5(listing)
            if check.actual != check.recorded and archive is not None:
                recorded = _cached_listing(archive, check.recorded)
                if recorded is not None:
                    check.details = {k: v for k, v in diff_listings(recorded, listing).items() if v}
        elif path.exists():
            check.actual = content_md5(path)
        checks.append(check)
    return checks


def _changed_locally(check: Check) -> bool:
    if check.actual is None or check.actual == check.recorded:
        return False
    if check.actual.endswith(".dir") and check.details:
        return bool(check.details.get("modified") or check.details.get("added"))
    return True


def pull_run(archive: ArchiveRepo, run_dir: Path, jobs: int | None = None) -> list[Check]:
    """Restore a run's archived outputs from the cache or the remote, then verify them."""
    from dvc.exceptions import CheckoutError

    outputs = recorded_outputs(run_dir)
    missing = [f"{name}.dvc" for name in outputs if not (run_dir / f"{name}.dvc").exists()]
    if missing:
        raise ArchiveError(f"run {run_dir.name}: {', '.join(missing)} missing; cannot tell DVC what to pull")
    # Never overwrite local work: files that exist and differ from the archive stop the pull
    # (files merely missing are what a pull is for).
    changed = [c.name for c in verify_run(archive, run_dir) if _changed_locally(c)]
    if changed:
        raise ArchiveError(
            f"run {run_dir.name}: local {', '.join(changed)} differ from the archive "
            f"(distill archive verify {run_dir.name}); move them away and pull again"
        )
    try:
        archive.repo.pull(targets=[str(run_dir / name) for name in outputs], remote=archive.remote, jobs=jobs)
    except CheckoutError as exc:
        raise ArchiveError(f"run {run_dir.name}: {exc}") from None
    _unprotect(archive, run_dir, list(outputs))
    return verify_run(archive, run_dir)


def archived_runs(settings: Settings) -> list[dict[str, Any]]:
    """One row per run with a completed push: sizes, file counts, remote, local presence."""

    rows = []
    for run_dir in sorted(settings.runs_dir.glob("*")) if settings.runs_dir.exists() else []:
        record = read_record(run_dir)
        if record is None:
            continue
        outputs = record["outputs"]
        rows.append(
            {
                "run_id": run_dir.name,
                "status": live_status(RunDir(run_dir).read_summary()),
                "size": sum(int(o.get("size") or 0) for o in outputs.values()),
                "files": sum(int(o.get("nfiles") or 1) for o in outputs.values()),
                "outputs": sorted(outputs),
                "local": all((run_dir / name).exists() for name in outputs),
                "remote": record["remote_url"],
                "pushed_at": record["pushed_at"],
            }
        )
    return rows
