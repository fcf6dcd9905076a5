"""A run as diagnose sees it: the files a run directory holds, loaded once into plain data.

Everything here reads; nothing trains, imports torch or talks to MLflow. Metrics become columnar
`Series` (numpy arrays of steps and values) so rules over 10,000-step runs stay instant.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from distill import registry


def _json_loader() -> Callable[[bytes], Any]:
    # orjson (a dependency) parses long metrics files 4x faster; fall back to json if it is missing.
    try:
        import orjson
    except ImportError:  # pragma: no cover - depends on the environment
        return json.loads
    return orjson.loads


json_loads = _json_loader()

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.settings import Settings


class RunNotReadable(ValueError):
    """The reference names no run, or the run's files cannot be read (CLI: one `error:` line, exit 2)."""


@dataclass
class Series:
    """One metric key over a run: the steps it was logged at and its values (NaN where non-finite)."""

    key: str
    steps: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return int(self.values.size)

    def finite(self) -> Series:
        keep = np.isfinite(self.values)
        return Series(self.key, self.steps[keep], self.values[keep])

    def window(self, fraction: float = 0.2, last: bool = True, min_points: int = 3) -> Series:
        """The first or last `fraction` of the points (at least `min_points`, at most all)."""
        n = len(self)
        size = min(n, max(min_points, math.ceil(n * fraction)))
        sl = slice(n - size, n) if last else slice(0, size)
        return Series(self.key, self.steps[sl], self.values[sl])

    def mean(self) -> float:
        return float(np.nanmean(self.values)) if len(self) else math.nan

    def median(self) -> float:
        return float(np.nanmedian(self.values)) if len(self) else math.nan

    def max(self) -> float:
        return float(np.nanmax(self.values)) if len(self) else math.nan

    def first(self) -> float:
        return float(self.values[0]) if len(self) else math.nan

    def last(self) -> float:
        return float(self.values[-1]) if len(self) else math.nan

    def slope(self) -> float:
        """Least-squares change per step; 0 for fewer than two distinct steps."""
        s = self.finite()
        if len(s) < 2 or s.steps[0] == s.steps[-1]:
            return 0.0
        x = s.steps.astype(np.float64)
        x = x - x.mean()
        return float((x * (s.values - s.values.mean())).sum() / (x * x).sum())

    def span(self) -> str:
        """`steps a-b` for evidence lines."""
        if not len(self):
            return "no steps"
        a, b = int(self.steps[0]), int(self.steps[-1])
        return f"step {a}" if a == b else f"steps {a}-{b}"


@dataclass
class EvalFile:
    """`eval/step-N.jsonl`: the metrics line and one row per item (id, correct out of k, responses)."""

    step: int
    metrics: dict[str, float]
    rows: list[dict[str, Any]]


@dataclass
class RunRecord:
    run_dir: Path
    summary: dict[str, Any]
    # The raw resolved config: rules read it by dotted key so configs of methods this version of
    # distill does not know yet (e.g. rose) still diagnose.
    config: dict[str, Any]
    run_config: RunConfig | None
    manifest: dict[str, Any]
    preflight: dict[str, Any] | None
    series: dict[str, Series]
    # Things that could not be read (a torn last metrics line, a corrupt eval file): reported, not fatal.
    problems: list[str] = field(default_factory=list)
    _evals: dict[tuple[str, int], EvalFile | None] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return str(self.summary.get("run_id") or self.run_dir.name)

    @property
    def method(self) -> str:
        return str(self.cfg("method.name") or self.summary.get("method") or "?")

    @property
    def teacher(self) -> str | None:
        """The teacher's name; a run with a teacher per domain: `rlve=A, dapo=B`."""
        teachers = self.cfg("teachers")
        if isinstance(teachers, dict) and teachers:
            return ", ".join(f"{d}={(t or {}).get('name')}" for d, t in teachers.items())
        name = self.cfg("teacher.name") or self.summary.get("teacher")
        return str(name) if name is not None else None

    @property
    def teacher_role(self) -> str | None:
        """How the method's teacher takes part (the registry's writes / continues / scores);
        None for a method this version does not know."""
        entry = registry.METHODS.get(self.method)
        return entry.teacher if entry else None

    @property
    def own_teacher(self) -> bool:
        """The teacher is the student's own weights (opsd): no model, vocabulary or server of its own."""
        entry = registry.METHODS.get(self.method)
        return bool(entry and entry.own_teacher)

    @property
    def async_teacher_capable(self) -> bool:
        entry = registry.METHODS.get(self.method)
        return bool(entry and entry.async_teacher)

    @property
    def domain(self) -> str:
        return str(self.cfg("domain.name") or self.summary.get("domain") or "?")

    def cfg(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def preflight_check(self, name: str) -> dict[str, Any] | None:
        """The preflight check `name` (`preflight.json` `checks.<name>`); a run over several domains
        keeps each domain's report under `parts.<domain>`: the first that failed (its detail led by
        the domain), else the first found. None when no report holds the check."""
        pre = self.preflight or {}
        reports = [("", pre)]
        parts = pre.get("parts")
        if isinstance(parts, dict):
            reports += [(str(d), r) for d, r in parts.items() if isinstance(r, dict)]
        found = []
        for domain, report in reports:
            checks = report.get("checks")
            entry = checks.get(name) if isinstance(checks, dict) else None
            if isinstance(entry, dict):
                found.append(
                    entry if not domain else {**entry, "detail": f"{domain}: {entry.get('detail', '')}"}
                )
        return next((e for e in found if e.get("ok") is False), found[0] if found else None)

    def get(self, key: str) -> Series | None:
        """A metric's finite points, or None when it was never logged (or never finite)."""
        s = self.series.get(key)
        if s is None:
            return None
        s = s.finite()
        return s if len(s) else None

    def benches(self) -> list[str]:
        """Benchmarks with student eval metrics (`eval/<bench>/...`; teacher evals are `teacher/eval/`)."""
        return sorted({k.split("/")[1] for k in self.series if k.startswith("eval/") and k.count("/") >= 2})

    def train_steps(self) -> int:
        for key in ("train/loss", "train/ce_loss", "train/grad_norm"):
            s = self.get(key)
            if s is not None:
                return int(s.steps[-1])
        return int(self.summary.get("steps") or 0)

    def eval_steps(self, prefix: str = "") -> list[int]:
        folder = self.run_dir / "eval" / prefix if prefix else self.run_dir / "eval"
        if not folder.is_dir():
            return []
        steps = []
        for path in folder.glob("step-*.jsonl"):
            tail = path.stem[5:]
            if tail.isdigit():
                steps.append(int(tail))
        return sorted(steps)

    def eval_file(self, step: int, prefix: str = "") -> EvalFile | None:
        key = (prefix, step)
        if key not in self._evals:
            folder = self.run_dir / "eval" / prefix if prefix else self.run_dir / "eval"
            self._evals[key] = self._read_eval(folder / f"step-{step}.jsonl", step)
        return self._evals[key]

    def _read_eval(self, path: Path, step: int) -> EvalFile | None:
        if not path.exists():
            return None
        try:
            lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            self.problems.append(f"{path.relative_to(self.run_dir)}: unreadable ({exc})")
            return None
        if not lines or "metrics" not in lines[0]:
            self.problems.append(f"{path.relative_to(self.run_dir)}: no metrics line")
            return None
        return EvalFile(step=step, metrics=lines[0]["metrics"], rows=lines[1:])

    def sample_rows(self, first_steps: int | None = None, limit: int = 400) -> list[dict[str, Any]]:
        """Rollout samples (`samples/step-N.jsonl`), oldest first; `first_steps` keeps steps <= it."""
        folder = self.run_dir / "samples"
        if not folder.is_dir():
            return []
        files = []
        for path in folder.glob("step-*.jsonl"):
            tail = path.stem[5:]
            if tail.isdigit() and (first_steps is None or int(tail) <= first_steps):
                files.append((int(tail), path))
        rows: list[dict[str, Any]] = []
        for _, path in sorted(files):
            # A damaged byte spoils one row's text, not the diagnosis: undecodable bytes become U+FFFD.
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                if len(rows) >= limit:
                    return rows
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
        return rows


# The steps a metrics row may carry: they are held as int64.
STEP_MIN, STEP_MAX = -(2**63), 2**63 - 1


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def read_metrics(path: Path) -> tuple[dict[str, Series], list[str]]:
    """metrics.jsonl -> one Series per key. Several lines may share a step (train line, eval line).

    Lines are grouped by their key set (every train line of a run has the same keys) and each group
    becomes one 2-D array: no per-value Python work, so 10,000 steps load in a blink.
    """
    if not path.exists():
        return {}, []
    groups: dict[tuple[str, ...], tuple[list[int], list[tuple[Any, ...]]]] = {}
    problems: list[str] = []
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json_loads(line)
                step = int(row.pop("step"))
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
                # A killed run can leave a torn last line; the rest of the record is still good.
                problems.append(f"metrics.jsonl line {lineno}: not a metrics row, skipped")
                continue
            if not STEP_MIN <= step <= STEP_MAX:  # 1e30 parses, then overflows numpy's int64
                problems.append(f"metrics.jsonl line {lineno}: step {step:.3g} out of range, skipped")
                continue
            steps, rows = groups.setdefault(tuple(row), ([], []))
            steps.append(step)
            rows.append(tuple(row.values()))
    chunks: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for keys, (steps, rows) in groups.items():
        if not keys:
            continue
        try:
            # Non-finite values are logged as the strings "nan"/"inf"; numpy parses those too.
            table = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(keys))
        except (TypeError, ValueError):
            table = np.array([[_number(v) for v in r] for r in rows], dtype=np.float64)
        step_arr = np.asarray(steps, dtype=np.int64)
        for j, key in enumerate(keys):
            chunks.setdefault(key, []).append((step_arr, table[:, j]))
    series = {}
    for key, parts in chunks.items():
        if len(parts) == 1:
            steps_k, values_k = parts[0]
        else:
            steps_k = np.concatenate([p[0] for p in parts])
            values_k = np.concatenate([p[1] for p in parts])
            order = np.argsort(steps_k, kind="stable")
            steps_k, values_k = steps_k[order], values_k[order]
        series[key] = Series(key, steps_k, np.ascontiguousarray(values_k))
    return series, problems


def _read_json(path: Path, problems: list[str]) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        problems.append(f"{path.name}: unreadable ({exc})")
        return {}
    return data if isinstance(data, dict) else {}


def resolve_run(ref: str | Path, settings: Settings | None = None) -> Path:
    from distill.settings import get_settings
    from distill.tracking.rundir import RunDir

    try:
        return RunDir.find(settings or get_settings(), str(ref)).path
    except ValueError as exc:
        raise RunNotReadable(str(exc)) from None


def load_run(ref: str | Path, settings: Settings | None = None) -> RunRecord:
    """A run by id, unique id prefix or path, read into a RunRecord."""
    from distill.config import ConfigError, load_run_config, read_yaml

    run_dir = resolve_run(ref, settings)
    try:
        raw = read_yaml(run_dir / "config.yaml")
    except ConfigError as exc:
        raise RunNotReadable(f"run {run_dir.name}: {exc}") from None
    try:
        typed: RunConfig | None = load_run_config(run_dir / "config.yaml")
    except ConfigError:
        typed = None  # a method or key this version does not know; the raw config still serves
    problems: list[str] = []
    series, metric_problems = read_metrics(run_dir / "metrics.jsonl")
    problems += metric_problems
    return RunRecord(
        run_dir=run_dir,
        summary=_read_json(run_dir / "summary.json", problems),
        config=raw,
        run_config=typed,
        manifest=_read_json(run_dir / "manifest.json", problems),
        preflight=_read_json(run_dir / "preflight.json", problems) or None,
        series=series,
        problems=problems,
    )
