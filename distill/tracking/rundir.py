"""A run directory: the one home of its file names, its summary and its tracking URI.

`<workspace>/runs/<run_id>/` holds `config.yaml` (resolved), `summary.json` (status, scores, the
MLflow run id and the tracking URI it was logged to), `metrics.jsonl`, `manifest.json`,
`checkpoints/step-N/`, `samples/`, `eval/`, `data/`, `diagnose/`, `preflight.json`, `run.lock`
while a process writes it, `run.lock.guard` (both `tracking.lock`) and, after a failure,
`error.log`. Everything that reads or writes a run folder goes through `RunDir`; the tracking URI
is resolved once, when the run is created, and read back from the summary after.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.config import load_run_config
from distill.config.models import run_name_problem
from distill.tracking.lock import RunRefused, lock_held, pid_alive

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.settings import Settings


def new_run_id(domain: str, method: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{domain}-{method}-{secrets.token_hex(2)}"


def resolve_tracking_uri(config: RunConfig, settings: Settings) -> str:
    """The store a run is logged to: its own `tracking.uri`, else DISTILL_TRACKING_URI, else the
    workspace's sqlite store. Resolved once at creation; readers use `RunDir.tracking_uri`."""
    return config.tracking.uri or settings.resolved_tracking_uri


def check_run_id(name: str, field: str = "run id") -> str:
    """`name` if it can be a run folder under `<workspace>/runs/`, else RunRefused naming `field`."""
    problem = run_name_problem(name)
    if problem:
        raise RunRefused(f"{field}: {problem}")
    return name


def live_status(summary: dict[str, Any]) -> str:
    """The recorded status, except RUNNING by a process that no longer exists reads DIED.

    The run lock says it when the run has one (a pid can be reused by an unrelated process);
    runs without a lock file fall back on the recorded pid."""
    status = str(summary.get("status", "?"))
    if status != "RUNNING":
        return status
    if summary.get("run_dir"):
        held = lock_held(RunDir(Path(str(summary["run_dir"]))))
        if held is not None:
            return "RUNNING" if held else "DIED"
    pid = summary.get("pid")
    if isinstance(pid, int) and not pid_alive(pid):
        return "DIED"  # killed without a chance to record it; `distill run --resume` continues it
    return status


STEP_PREFIX = "step-"


def step_name(step: int) -> str:
    """The name of step `step`'s checkpoint folder, samples file and eval file (less suffix)."""
    return f"{STEP_PREFIX}{step}"


def step_of(name: str | Path) -> int | None:
    """The step a `step-N` name (a folder, or a file such as `step-N.jsonl` or `teacher/step-N.jsonl`)
    stands for; None for any other name."""
    stem = Path(name).name.split(".", 1)[0]
    tail = stem[len(STEP_PREFIX) :] if stem.startswith(STEP_PREFIX) else ""
    return int(tail) if tail.isdigit() else None


class RunDir:
    """One run's folder. Paths are attributes; the folder may not exist yet (`create`). The
    names of its files live here and nowhere else."""

    CONFIG = "config.yaml"
    SUMMARY = "summary.json"
    METRICS = "metrics.jsonl"
    MANIFEST = "manifest.json"
    PREFLIGHT = "preflight.json"
    ERROR_LOG = "error.log"
    LOCK = "run.lock"
    # Held for an instant while the lock is taken or given back (tracking/lock.py); never removed.
    LOCK_GUARD = "run.lock.guard"
    CHECKPOINTS = "checkpoints"
    SAMPLES = "samples"
    EVAL = "eval"
    DATA = "data"
    DIAGNOSE = "diagnose"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # -- where things are -----------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def summary(self) -> Path:
        return self.path / self.SUMMARY

    @property
    def metrics(self) -> Path:
        return self.path / self.METRICS

    @property
    def manifest(self) -> Path:
        return self.path / self.MANIFEST

    @property
    def preflight(self) -> Path:
        return self.path / self.PREFLIGHT

    @property
    def error_log(self) -> Path:
        return self.path / self.ERROR_LOG

    @property
    def lock(self) -> Path:
        return self.path / self.LOCK

    @property
    def lock_guard(self) -> Path:
        return self.path / self.LOCK_GUARD

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def samples(self) -> Path:
        return self.path / self.SAMPLES

    @property
    def eval(self) -> Path:
        return self.path / self.EVAL

    @property
    def data(self) -> Path:
        return self.path / self.DATA

    @property
    def diagnose(self) -> Path:
        return self.path / self.DIAGNOSE

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / step_name(step)

    def samples_file(self, step: int) -> Path:
        return self.samples / f"{step_name(step)}.jsonl"

    def eval_file(self, step: int, prefix: str = "") -> Path:
        """`eval/step-N.jsonl`, or a model's other than the student's (`teacher/`) under `prefix`."""
        return self.eval / f"{prefix}{step_name(step)}.jsonl"

    # -- finding and creating ---------------------------------------------------------------
    @classmethod
    def create(cls, runs_dir: Path, run_id: str) -> RunDir:
        run = cls(runs_dir / check_run_id(run_id, "tracking.run_name"))
        if run.path.exists():
            raise RunRefused(f"run directory {run.path} already exists; pick another tracking.run_name")
        run.path.mkdir(parents=True)
        return run

    @classmethod
    def find(cls, settings: Settings, ref: str) -> RunDir:
        """A run by path, by id, or by unique id prefix; RunRefused (one line) when there is none."""
        runs_dir = settings.runs_dir
        if (Path(ref) / cls.CONFIG).exists():
            return cls(Path(ref))
        try:
            # Anything else is an id under runs/: never a path out of it, nor a glob pattern.
            check_run_id(ref)
        except RunRefused:
            raise RunRefused(f"no run {ref!r}: not a run directory, nor a run id under {runs_dir}") from None
        if (runs_dir / ref / cls.CONFIG).exists():
            return cls(runs_dir / ref)
        matches = sorted(runs_dir.glob(f"{glob.escape(ref)}*")) if runs_dir.exists() else []
        matches = [m for m in matches if (m / cls.CONFIG).exists()]
        if len(matches) == 1:
            return cls(matches[0])
        if len(matches) > 1:
            raise RunRefused(f"run {ref!r} is ambiguous: {', '.join(m.name for m in matches[:5])}")
        raise RunRefused(f"no run {ref!r} under {runs_dir}")

    @classmethod
    def all(cls, settings: Settings) -> list[RunDir]:
        """Every run under the workspace, in name order."""
        runs_dir = settings.runs_dir
        if not runs_dir.exists():
            return []
        return [cls(p) for p in sorted(runs_dir.iterdir()) if (p / cls.CONFIG).exists()]

    # -- the records ----------------------------------------------------------------------
    def read_summary(self) -> dict[str, Any]:
        return json.loads(self.summary.read_text()) if self.summary.exists() else {}

    def write_summary(self, summary: dict[str, Any]) -> None:
        self._replace(self.summary, json.dumps(summary, indent=2))

    def tracking_uri(self, settings: Settings) -> str:
        """The store this run was logged to (recorded at creation), else today's default."""
        uri = self.read_summary().get("tracking_uri")
        return str(uri) if uri else settings.resolved_tracking_uri

    def mlflow_run_id(self) -> str | None:
        run_id = self.read_summary().get("mlflow_run_id")
        return str(run_id) if run_id else None

    def read_config(self) -> RunConfig:
        return load_run_config(self.config)

    def read_manifest(self) -> dict[str, Any]:
        try:
            data = json.loads(self.manifest.read_text())
        except FileNotFoundError:
            raise ValueError(
                f"{self.manifest} is missing (the run never got past loading its models?)"
            ) from None
        except ValueError as exc:
            raise ValueError(f"{self.manifest} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{self.manifest} must hold a JSON object")
        return data

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        # Replaced, never written into: an archived manifest may be a hardlink into the DVC cache.
        self._replace(self.manifest, json.dumps(manifest, indent=2))

    def read_preflight(self) -> dict[str, Any]:
        try:
            data = json.loads(self.preflight.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write_preflight(self, report: dict[str, Any]) -> None:
        self._replace(self.preflight, json.dumps(report, indent=2))

    def last_checkpoint(self) -> Path | None:
        """The newest complete `checkpoints/step-N` (renamed into place only once fully written)."""
        if not self.checkpoints.exists():
            return None
        steps = []
        for child in self.checkpoints.iterdir():
            step = step_of(child.name) if child.is_dir() else None
            if step is not None and child.name == step_name(step):
                steps.append((step, child))
        return max(steps)[1] if steps else None

    def metric_rows(self) -> list[dict[str, Any]]:
        """The lines of `metrics.jsonl`; a line cut short by a kill mid-write is left out."""
        if not self.metrics.exists():
            return []
        rows = []
        for line in self.metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
        return rows

    def metric_points(self) -> list[tuple[str, float, int]]:
        """(key, value, step) of every figure in `metrics.jsonl`, non-finite ones as floats again."""
        points = []
        for row in self.metric_rows():
            for key, value in row.items():
                if key == "step" or isinstance(value, bool):
                    continue
                if isinstance(value, int | float):
                    points.append((key, float(value), row["step"]))
                elif value in ("nan", "inf", "-inf"):  # StepLog writes non-finite figures as text
                    points.append((key, float(value), row["step"]))
        return points

    def trim_metrics(self, last_step: int, final_step: int, redo_at_start: tuple[str, ...] = ()) -> None:
        """On resume, drop metric lines past the checkpoint (those steps are trained again), the
        final eval's lines at `final_step` (written after that step's checkpoint, it runs again)
        and, at step 0, the figures under `redo_at_start` (evals the run did not finish before it
        stopped, which run again)."""
        if not self.metrics.exists():
            return
        kept = []
        for row in self.metric_rows():
            if row["step"] > last_step or (
                row["step"] == final_step and any(k.startswith("eval/") for k in row)
            ):
                continue
            if row["step"] == 0 and redo_at_start:
                row = {k: v for k, v in row.items() if k == "step" or not k.startswith(redo_at_start)}
                if len(row) == 1:
                    continue
            kept.append(json.dumps(row))
        self._replace(self.metrics, "".join(line + "\n" for line in kept))

    def _replace(self, path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
