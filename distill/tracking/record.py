"""A run's record in MLflow, kept equal to its run directory whatever way the run ended.

`metrics.jsonl` is the record MLflow is brought level with: every (key, step) point in the file is
in the MLflow run once, and nothing else is. Three moments need more than the tracker's own
buffered writes:

- every exit path (FINISHED, FAILED, KILLED) logs the run's files as artifacts (`log_record`); a
  store that refuses them costs a warning line, never the run's own outcome or error;
- `--resume` trims `metrics.jsonl` to the checkpoint and trains those steps again. MLflow cannot
  delete metric points, so the resumed run gets a fresh MLflow run (same name, experiment, params,
  tags and parent) that the trimmed file is replayed into, and the old one is ended (KILLED, if
  it was still RUNNING) and deleted (`adopt_fresh_run`). The new id goes into `summary.json`
  before anything else: readers of `mlflow_run_id` (archive, reproduce, diagnose) follow it;
- a run killed with SIGKILL recorded nothing: `repair_run` (`distill runs --repair`) marks it DIED,
  sends the points the tracker still held and logs its files. Up to that moment the MLflow run
  holds a subset of the file (a point is written to the file before it is queued for MLflow), so
  adding the missing (key, step) points makes them equal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill import __version__
from distill.config import flatten
from distill.tracking.lock import RunLock
from distill.tracking.mlflow import MlflowTracker, git_tags, mlflow_metric_name, open_tracker, retire_runs
from distill.tracking.rundir import RunDir, live_status

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.settings import Settings
    from distill.tracking.base import Tracker
    from distill.tracking.mlflow import MlflowTracker
    from distill.tracking.rundir import RunDir

Say = Callable[[str], Any]
# MLflow has no DIED: a run that died is KILLED there, with `distill.status` saying DIED.
MLFLOW_STATUS = {"FINISHED": "FINISHED", "FAILED": "FAILED", "KILLED": "KILLED", "DIED": "KILLED"}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def log_record(run: RunDir, tracker: Tracker, say: Say) -> bool:
    """The run's files as artifacts of its MLflow run: config, manifest, preflight, summary,
    metrics, error log, samples, evals and the diagnose report. False (and one warning) when the
    store refused them."""
    files = [run.config, run.manifest, run.preflight, run.summary, run.metrics, run.error_log]
    paths: list[tuple[Path, str | None]] = [(path, None) for path in files if path.is_file()]
    paths += [(folder, folder.name) for folder in (run.samples, run.eval, run.diagnose) if folder.is_dir()]
    try:
        for path, where in paths:
            tracker.log_artifact(path, where)
    except Exception as exc:  # the first refusal says enough; a store that is down refuses them all
        say(
            f"warning: the run's files were not logged to MLflow run {tracker.run_id} ({_first_line(exc)}); "
            f"`distill runs --repair {run.name}` logs them"
        )
        return False
    return True


def adopt_fresh_run(
    run: RunDir, tracker: MlflowTracker, summary: dict[str, Any], replaced: list[str], say: Say
) -> None:
    """Make `tracker`'s new MLflow run the run's record: replay the (trimmed) metrics.jsonl,
    point summary and manifest at it, log the files so far, end and delete the runs it replaces.

    `replaced` stays in summary.json (`mlflow_superseded`) until they are deleted, so a resume
    that dies half-way deletes them next time."""
    summary["mlflow_run_id"] = tracker.run_id
    if replaced:
        summary["mlflow_superseded"] = replaced
    run.write_summary(summary)  # the commit point: from here on readers follow the new run
    points = run.metric_points()
    tracker.log_points(points)
    if run.manifest.exists():
        manifest = run.read_manifest()
        manifest["mlflow_run_id"] = tracker.run_id
        run.write_manifest(manifest)
    log_record(run, tracker, say)
    left = retire_runs(str(summary["tracking_uri"]), replaced, tracker.run_id) if replaced else []
    if left:
        summary["mlflow_superseded"] = left
        say(f"warning: MLflow runs {', '.join(left)} could not be deleted; the next resume retries")
    else:
        summary.pop("mlflow_superseded", None)
    run.write_summary(summary)
    if replaced:
        say(
            f"mlflow: run {tracker.run_id} replaces {', '.join(replaced)} "
            f"({len(points)} points of metrics.jsonl re-logged)"
        )


def open_run_tracker(
    config: RunConfig,
    settings: Settings,
    run: RunDir,
    summary: dict[str, Any],
    resume_from: Path | None,
    resuming: bool,
    say: Say,
) -> MlflowTracker:
    """The run's MLflow run: a new one, also on resume (the fresh run that replaces the old,
    `adopt_fresh_run`); params, tags (and the replaced run's, its parent included) set."""
    tags = {
        "domain": config.domain.name,
        "method": config.method.name,
        "student": config.student.name,
        # A run over several domains: each domain's teacher, `rlve=<model>,dapo=<model>`.
        "teacher": ",".join(f"{d}={m.name}" for d, m in config.teachers.items()) or config.teacher.name,
        "distill.version": __version__,
        "distill.run_dir": str(run.path.resolve()),
        **git_tags(),
    }
    if resume_from is not None:
        tags["checkpoint.last"] = str(resume_from)
    old = summary.get("mlflow_run_id")
    tracker = open_tracker(
        str(summary["tracking_uri"]),
        config.tracking.experiment,
        settings.artifact_root,
        run_name=run.name,
        tags=tags,
        parent_run_id=config.tracking.parent_run_id,
        inherit_tags_from=str(old) if old else None,
    )
    tracker.log_params(flatten(config.model_dump(mode="json")))
    if resuming:
        replaced = [*summary.pop("mlflow_superseded", []), *([str(old)] if old else [])]
        adopt_fresh_run(run, tracker, summary, replaced, say)
    else:
        summary["mlflow_run_id"] = tracker.run_id
        run.write_summary(summary)
    return tracker


def _last_sign_of_life(run: RunDir) -> str:
    """When a run that died last wrote its records: the nearest thing to its end time."""
    times = [p.stat().st_mtime for p in (run.metrics, run.summary) if p.exists()]
    stamp = max(times) if times else datetime.now(UTC).timestamp()
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds")


def mark_died(run: RunDir, summary: dict[str, Any]) -> None:
    """A run recorded RUNNING whose writer is gone (the caller holds its lock): DIED, with why."""
    pid = summary.get("pid")
    summary.update(
        status="DIED",
        error=f"its process (pid {pid}) ended without recording how (SIGKILL, out of memory, or the "
        f"machine went down); `distill run --resume {run.name}` continues it",
        finished=_last_sign_of_life(run),
    )


def repair_run(
    run: RunDir, settings: Settings, say: Say, diagnose: Callable[[RunDir, dict[str, Any], Say], None]
) -> None:
    """Bring a run that is not running to a full record (the caller holds its lock): DIED if it
    was left RUNNING, its diagnosis, the MLflow run level with metrics.jsonl, ended with the
    run's status, and its files logged. Raises when the MLflow store refuses."""
    summary = run.read_summary()
    if summary.get("status") == "RUNNING":
        mark_died(run, summary)
    status = str(summary.get("status", "DIED"))
    diagnose(run, summary, say)
    run.write_summary(summary)
    run_id, uri = summary.get("mlflow_run_id"), summary.get("tracking_uri")
    if not run_id or not uri:
        say(f"{run.name}: {status}; no MLflow run recorded (it ended before opening one)")
        return
    tracker = MlflowTracker.attach(str(uri), str(run_id))
    points = run.metric_points()
    held = tracker.logged_points()
    wanted = Counter((mlflow_metric_name(key), step) for key, _, step in points)
    if held - wanted:
        # MLflow holds points the file no longer has (a resume that trimmed the file, then could
        # not reach the store): points cannot be deleted, so a fresh run replaces this one.
        tracker.finish(MLFLOW_STATUS.get(status, "KILLED"))
        tracker = open_run_tracker(
            run.read_config(), settings, run, summary, run.last_checkpoint(), True, say
        )
        added = len(points)
    else:
        missing = [
            (key, value, step) for key, value, step in points if (mlflow_metric_name(key), step) not in held
        ]
        tracker.log_points(missing)
        added = len(missing)
    tags = {"distill.status": status}
    last = run.last_checkpoint()
    if last is not None:
        tags["checkpoint.last"] = str(last)
    tracker.set_tags(tags)
    logged = log_record(run, tracker, say)
    tracker.finish(MLFLOW_STATUS.get(status, "KILLED"), error=summary.get("error"))
    files = "files logged" if logged else "files NOT logged"
    say(
        f"{run.name}: {status}; MLflow run {tracker.run_id} level with metrics.jsonl (+{added} points), {files}"
    )


def repair_runs(
    settings: Settings, ref: str | None, say: Say, diagnose: Callable[[RunDir, dict[str, Any], Say], None]
) -> int:
    """`distill runs --repair [RUN]`: every run whose process died while RUNNING (or RUN, whatever
    its status, once nothing writes it) gets its full record. 0, or 1 when a store refused."""

    def died(run: RunDir) -> bool:  # left RUNNING by a process that is gone, not yet marked
        try:
            summary = run.read_summary()
            return summary.get("status") == "RUNNING" and live_status(summary) == "DIED"
        except (OSError, ValueError):  # an unreadable summary.json is no run to repair
            return False

    runs = [RunDir.find(settings, ref)] if ref is not None else [r for r in RunDir.all(settings) if died(r)]
    if not runs:
        say("nothing to repair: no run died without recording its end")
    code = 0
    for run in runs:
        lock = RunLock.try_acquire(run)
        if lock is None:
            say(f"{run.name}: still running; nothing to repair")
            continue
        with lock:
            try:
                repair_run(run, settings, say, diagnose)
            except Exception as exc:
                say(f"{run.name}: not repaired ({_first_line(exc)})")
                code = 1
    return code
