"""MLflow backend for `Tracker`.

mlflow is imported inside functions only: importing it costs seconds and `distill --help` must stay
instant. The client API is used throughout (never `mlflow.start_run`), so several trackers can live in
one process without sharing global run state.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# Backend limits of `log_batch`; the auto-flush threshold keeps memory and write latency small.
METRIC_CHUNK = 1000
PARAM_CHUNK = 100
TAG_CHUNK = 100
AUTO_FLUSH = 500
# How often the writer thread sends queued points (also at once when AUTO_FLUSH are queued).
FLUSH_INTERVAL_S = 2.0
MAX_PARAM_CHARS = 6000
MAX_ERROR_CHARS = 5000
STATUSES = ("FINISHED", "FAILED", "KILLED")
SQLITE_PREFIX = "sqlite:///"
# Tags a resumed run's fresh MLflow run does not take over from the run it replaces: how that
# attempt ended is not how this one will.
NOT_INHERITED = ("distill.error", "distill.status", "distill.replaced_by", "mlflow.runName")


def is_server(uri: str) -> bool:
    """A tracking server (http/https), as opposed to a store this process opens itself."""
    return uri.split(":", 1)[0].lower() in ("http", "https")


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _param_value(value: Any) -> str:
    if isinstance(value, list | tuple | dict):
        text = json.dumps(value, default=str)
    else:
        text = str(value)
    return text[:MAX_PARAM_CHARS]


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith(SQLITE_PREFIX):
        return None
    rest = uri[len(SQLITE_PREFIX) :].split("?", 1)[0]
    if not rest or rest == ":memory:":
        return None
    return Path(rest)


def _get_or_create_experiment(
    client: MlflowClient, name: str, artifact_root: Path | None, server: bool = False
) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    # A server's experiments use the server's artifact store (proxied by `mlflow server
    # --serve-artifacts`): a file:// location of this machine would keep artifacts off the server.
    location = None
    if artifact_root is not None and not server:
        location = (artifact_root / name).resolve().as_uri()
    try:
        # The experiment kind makes the MLflow UI open it as model training, not as a GenAI app.
        return str(
            client.create_experiment(
                name,
                artifact_location=location,
                tags={"mlflow.experimentKind": "custom_model_development"},
            )
        )
    except MlflowException:
        # Another process won the race (only possible for non-sqlite stores, which are not locked).
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


def _connect(uri: str, experiment: str, artifact_root: Path | None) -> tuple[MlflowClient, str]:
    from mlflow.tracking import MlflowClient

    db_path = _sqlite_path(uri)
    if db_path is None:
        client = MlflowClient(tracking_uri=uri)
        return client, _get_or_create_experiment(client, experiment, artifact_root, is_server(uri))

    import logging

    from filelock import FileLock

    # "Creating initial MLflow database tables..." is mlflow's business, not the user's.
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Two processes creating a fresh DB at once race inside mlflow's alembic migrations.
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(db_path) + ".lock"):
        client = MlflowClient(tracking_uri=uri)
        return client, _get_or_create_experiment(client, experiment, artifact_root)


def mlflow_metric_name(key: str) -> str:
    """MLflow rejects '@' and '+' in metric names: `eval/aime25/avg@16` is stored as
    `eval/aime25/avg_at_16`, a mixed domain's `eval/rlve+dapo/accuracy` as `eval/rlve_and_dapo/accuracy`."""
    return key.replace("@", "_at_").replace("+", "_and_")


class MlflowTracker:
    """One MLflow run. Metrics are buffered and written by a background thread with `log_batch`,
    so a slow or unreachable store never blocks a training step; `flush` and `finish` write
    everything out (the runner calls `finish` on every exit path but SIGKILL, and `metrics.jsonl`
    stays the record MLflow is brought level with)."""

    def __init__(self, client: MlflowClient, run_id: str, uri: str = "") -> None:
        self.client = client
        self.run_id = run_id
        self.uri = uri
        self._buffer: list[Any] = []
        self._tags: list[Any] = []
        self._finished = False
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._failing: str | None = None  # the last write error while the store is unreachable
        self._writer = threading.Thread(target=self._write_loop, name=f"mlflow-{run_id[:8]}", daemon=True)
        self._writer.start()

    @classmethod
    def open_tracker(
        cls,
        uri: str,
        experiment: str,
        artifact_root: Path | None,
        run_name: str | None = None,
        resume_run_id: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, str] | None = None,
        inherit_tags_from: str | None = None,
    ) -> MlflowTracker:
        """A new run (or `resume_run_id` re-opened). `inherit_tags_from`: a run this one replaces,
        whose tags (its parent run's included) the new run starts with."""
        client, experiment_id = _connect(uri, experiment, artifact_root)
        all_tags = _inherited_tags(client, inherit_tags_from) if inherit_tags_from else {}
        all_tags.update(tags or {})
        if parent_run_id is not None:
            all_tags["mlflow.parentRunId"] = parent_run_id
        if resume_run_id is not None:
            client.get_run(resume_run_id)  # fail early on an unknown id
            client.update_run(resume_run_id, status="RUNNING")
            tracker = cls(client, resume_run_id, uri)
            if all_tags:
                tracker.set_tags(all_tags)
            return tracker
        run = client.create_run(experiment_id, run_name=run_name, tags=all_tags)
        return cls(client, run.info.run_id, uri)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        values = {key: _param_value(value) for key, value in params.items()}
        for chunk in _chunks(list(values.items()), PARAM_CHUNK):
            try:
                self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in chunk])
            except MlflowException:
                # Resumed runs re-log their config: equal values are fine, changed ones must still fail.
                existing = self.client.get_run(self.run_id).data.params
                for key, value in chunk:
                    if existing.get(key) != value:
                        self.client.log_param(self.run_id, key, value)

    def set_tags(self, tags: dict[str, str]) -> None:
        """Queue the tags like metrics (a checkpoint's tag must not wait on a slow store)."""
        from mlflow.entities import RunTag

        with self._lock:
            self._tags.extend(RunTag(k, str(v)) for k, v in tags.items())

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Queue the points; the writer thread sends them (never on the caller's step)."""
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        points = [
            Metric(mlflow_metric_name(k), float(v), timestamp, int(step))
            for k, v in metrics.items()
            if v is not None
        ]
        with self._lock:
            self._buffer.extend(points)
            pending = len(self._buffer)
        if pending > AUTO_FLUSH:
            self._wake.set()

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    @classmethod
    def attach(cls, uri: str, run_id: str) -> MlflowTracker:
        """A tracker on an existing run, its status left as it is (`distill runs --repair`)."""
        client = client_for(uri)
        client.get_run(run_id)  # fail early on an unknown id
        return cls(client, run_id, uri)

    def log_points(self, points: list[tuple[str, float, int]]) -> int:
        """Write (key, value, step) points now, on this thread, in `log_batch` chunks (a resumed
        run's replay of metrics.jsonl); raises if the store refuses them."""
        from mlflow.entities import Metric

        timestamp = int(time.time() * 1000)
        metrics = [Metric(mlflow_metric_name(k), float(v), timestamp, int(s)) for k, v, s in points]
        for chunk in _chunks(metrics, METRIC_CHUNK):
            self.client.log_batch(self.run_id, metrics=chunk)
        return len(metrics)

    def logged_points(self) -> Counter[tuple[str, int]]:
        """(MLflow key, step) of every metric point the run holds, with how often it holds it."""
        keys = self.client.get_run(self.run_id).data.metrics
        return Counter((k, m.step) for k in keys for m in self.client.get_metric_history(self.run_id, k))

    def flush(self) -> None:
        """Write every queued point now, on this thread; raises if the store refuses them."""
        self._write_pending()

    def sync(self, timeout_s: float) -> bool:
        """Have the writer thread send everything queued and wait up to `timeout_s` for it; False
        at once while the store is unreachable (the writer keeps the points and retries)."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        while self._failing is None and time.monotonic() < deadline and self._writer.is_alive():
            with self._lock:
                if not self._buffer and not self._tags:
                    return True
            time.sleep(0.02)
        with self._lock:
            return not self._buffer and not self._tags

    def finish(self, status: str = "FINISHED", error: str | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if self._finished:
            return
        self._stop = True
        self._wake.set()
        self._writer.join(timeout=FLUSH_INTERVAL_S * 4)
        self.flush()
        if error:
            self.client.set_tag(self.run_id, "distill.error", error[:MAX_ERROR_CHARS])
        self.client.set_terminated(self.run_id, status=status)
        self._finished = True

    def _write_pending(self) -> None:
        # One writer at a time (the thread, or `flush` on the caller's): a point is sent once.
        # Points are dropped only once written, so a failed write is retried.
        with self._writing:
            while True:
                with self._lock:
                    tags = self._tags[:TAG_CHUNK]
                    chunk = [] if tags else self._buffer[:METRIC_CHUNK]
                if not tags and not chunk:
                    return
                self.client.log_batch(self.run_id, metrics=chunk, tags=tags)
                with self._lock:
                    del self._tags[: len(tags)]
                    del self._buffer[: len(chunk)]

    def _write_loop(self) -> None:
        """The writer thread: every FLUSH_INTERVAL_S (sooner when the queue is long), until finish."""
        while not self._stop:
            self._wake.wait(FLUSH_INTERVAL_S)
            self._wake.clear()
            if self._stop:
                return
            try:
                self._write_pending()
            except Exception as exc:  # keep the points and say so once; the run goes on
                if self._failing is None:
                    with self._lock:
                        held = len(self._buffer)
                    print(
                        f"warning: tracking store {self.uri or 'MLflow'} unreachable ({type(exc).__name__}); "
                        f"{held} metric points held, retrying every {FLUSH_INTERVAL_S:g} s",
                        file=sys.stderr,
                        flush=True,
                    )
                self._failing = f"{type(exc).__name__}: {exc}"
                continue
            if self._failing is not None:
                print(
                    f"tracking store {self.uri or 'MLflow'} reachable again; held points written",
                    file=sys.stderr,
                    flush=True,
                )
                self._failing = None


open_tracker = MlflowTracker.open_tracker


def _inherited_tags(client: MlflowClient, run_id: str) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    try:
        tags = client.get_run(run_id).data.tags
    except MlflowException:  # deleted, or never reached this store: nothing to carry over
        return {}
    return {k: v for k, v in tags.items() if k not in NOT_INHERITED}


def retire_runs(uri: str, run_ids: list[str], successor: str) -> list[str]:
    """End and delete the runs a resumed run replaced (MLflow cannot delete metric points, so a
    resume starts a fresh run); their nested runs (e.g. `distill eval` of a checkpoint) move under
    `successor`. Returns the ids that could not be deleted.

    A replaced run still RUNNING (its process was SIGKILLed, or `--resume` took over a run the
    store never heard the end of) is ended KILLED, now, before it is deleted: left RUNNING with no
    end time it would look live to anything that lists runs by status, deleted ones included.
    One that already ended keeps how and when it ended (FAILED says more than KILLED)."""
    from mlflow.entities import RunStatus, ViewType
    from mlflow.exceptions import MlflowException

    client = client_for(uri)
    left = []
    for run_id in run_ids:
        try:
            info = client.get_run(run_id).info
            if info.lifecycle_stage == "deleted":  # an earlier resume got this far
                continue
            # Run ids are MLflow's own hex ids: safe inside a filter string.
            for child in client.search_runs(
                [info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'", ViewType.ACTIVE_ONLY
            ):
                client.set_tag(child.info.run_id, "mlflow.parentRunId", successor)
            client.set_tag(run_id, "distill.replaced_by", successor)
            if info.end_time is None or not RunStatus.is_terminated(RunStatus.from_string(info.status)):
                client.set_terminated(run_id, status="KILLED", end_time=int(time.time() * 1000))
            client.delete_run(run_id)
        except MlflowException as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(getattr(exc, "error_code", "")):
                left.append(run_id)
    return left


def git_tags(cwd: Path | None = None) -> dict[str, str]:
    """Commit and dirtiness of the source checkout, so a run can be traced to the code that made it."""
    where = cwd if cwd is not None else Path(__file__).resolve().parents[2]
    unknown = {"git.sha": "unknown", "git.dirty": "unknown"}
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=where, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return unknown
    if sha.returncode != 0 or status.returncode != 0:
        return unknown
    head = sha.stdout.strip()
    return {
        "git.sha": head,
        "git.dirty": "true" if status.stdout.strip() else "false",
        "mlflow.source.git.commit": head,
    }


def find_runs(uri: str, experiment: str | None = None, filter_string: str = "") -> list[dict[str, Any]]:
    """Runs newest first, as plain dicts for listing; an unknown experiment has no runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    if experiment is not None:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return []
        experiment_ids = [found.experiment_id]
    else:
        experiment_ids = [e.experiment_id for e in client.search_experiments()]
    if not experiment_ids:
        return []
    out: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = client.search_runs(
            experiment_ids,
            filter_string=filter_string,
            order_by=["attributes.start_time DESC"],
            max_results=1000,
            page_token=token,
        )
        for run in page:
            out.append(
                {
                    "run_id": run.info.run_id,
                    "run_name": run.info.run_name,
                    "status": run.info.status,
                    "start_time": run.info.start_time,
                    "tags": dict(run.data.tags),
                    "params": dict(run.data.params),
                    "metrics": dict(run.data.metrics),
                }
            )
        token = page.token
        if not token:
            return out


def mlflow_ui_command(uri: str, artifact_root: Path | None) -> str:
    """How to open the MLflow UI on this store: a server's own URL, else the `mlflow ui` command."""
    if is_server(uri):
        return uri
    parts = ["mlflow", "ui", "--backend-store-uri", uri]
    if artifact_root is not None:
        parts += ["--default-artifact-root", artifact_root.resolve().as_uri()]
    parts += ["--port", "5000"]
    return " ".join(shlex.quote(p) for p in parts)


# -- one-off client calls on existing runs (archive, diagnose): every MLflow call is made here --


def client_for(uri: str) -> MlflowClient:
    """A client of the store at `uri` (a sqlite store is created under its file lock)."""
    from mlflow.tracking import MlflowClient

    db_path = _sqlite_path(uri)
    if db_path is not None and not db_path.exists():
        _connect(uri, "Default", None)
    return MlflowClient(tracking_uri=uri)


def log_artifacts_to(uri: str, run_id: str, folder: Path, artifact_path: str | None = None) -> None:
    """Files of `folder` as artifacts of an existing run, leaving its status as it is (re-opening
    it through a tracker would set it RUNNING and then change how it ended)."""
    client_for(uri).log_artifacts(run_id, str(folder), artifact_path)


def tag_run(client: MlflowClient, run_id: str, tags: dict[str, str], artifact: Path | None = None) -> None:
    """Set `tags` on an existing run (one batch) and log `artifact` to it."""
    from mlflow.entities import RunTag

    client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    if artifact is not None:
        client.log_artifact(run_id, str(artifact))


def runs_named(uri: str, run_name: str) -> list[dict[str, Any]]:
    """Runs whose name is exactly `run_name`, newest first, in every experiment of the store.

    The name is compared here, never written into an MLflow filter string: a quote in user text
    must not reach the store's query language.
    """
    return [run for run in find_runs(uri) if run["run_name"] == run_name]


def download_artifact(uri: str, run_id: str, name: str, target: Path) -> bool:
    """Copy artifact `name` of a run to `target`; False when the artifact store is out of reach."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = Path(client_for(uri).download_artifacts(run_id, name, tmp))
        except Exception:  # an artifact store this machine cannot reach
            return False
        shutil.copyfile(path, target)
    return True
