"""What the CLI prints about runs and the zoo."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

from distill.cli.common import console as _console
from distill.settings import Settings, get_settings
from distill.tracking.rundir import RunDir, live_status

console = _console()


def _pct(metrics: dict[str, float] | None, key: str = "accuracy") -> str:
    if not isinstance(metrics, dict):  # absent, or a hand-edited summary
        return "-"
    try:
        if key == "accuracy" and key not in metrics and "success" in metrics:
            # A multi-turn domain (sciworld) reports Score / Success / Pass(>0) instead of accuracy.
            return (
                f"Score {metrics['score']:.3f} Success {metrics['success']:.0%} "
                f"Pass>0 {metrics['pass_gt0']:.0%}"
            )
        return f"{metrics[key]:.1%}" if key in metrics else "-"
    except (KeyError, TypeError, ValueError):
        return "?"


def print_run_summary(summary: dict[str, Any], settings: Settings) -> None:
    from distill.tracking.mlflow import mlflow_ui_command

    before, after = summary.get("student_before", {}), summary.get("student_after", {})
    teacher = summary.get("teacher_score", {})
    delta = (after.get("accuracy", 0.0) - before.get("accuracy", 0.0)) * 100
    uri = summary.get("tracking_uri", settings.resolved_tracking_uri)
    console.print()
    console.print(
        f"[bold]run {summary['run_id']}[/bold]  {summary['status']}  ({summary.get('seconds', 0):.0f} s)"
    )
    if "success" in after:  # multi-turn domain: _pct shows its three metrics
        console.print(f"  student  {_pct(before)} -> {_pct(after)}")
    else:
        console.print(f"  student  accuracy {_pct(before)} -> {_pct(after)}  ({delta:+.1f} points)")
    if teacher:
        console.print(f"  teacher  {'' if 'success' in teacher else 'accuracy '}{_pct(teacher)}")
    for part, scores in (summary.get("parts") or {}).items():  # a run over several domains
        b, a, t = (scores.get(k, {}) for k in ("student_before", "student_after", "teacher_score"))
        gain = (a.get("accuracy", 0.0) - b.get("accuracy", 0.0)) * 100
        console.print(
            f"    {part:<8} student {_pct(b)} -> {_pct(a)}  ({gain:+.1f} points), teacher {_pct(t)}"
        )
    diag = summary.get("diagnose")
    if diag:
        counts = ", ".join(f"{n} {label}" for label, n in diag["counts"].items() if n and label != "info")
        named = f": {', '.join(diag['findings'])}" if diag["findings"] else ""
        console.print(f"  diagnose {counts or 'no warnings'}{named}  (distill diagnose {summary['run_id']})")
    console.print(f"  run dir  {summary['run_dir']}")
    console.print(f"  mlflow   run {summary.get('mlflow_run_id')} in {uri}")
    console.print(f"  open UI  {mlflow_ui_command(uri, settings.artifact_root)}")


# The status of a run whose summary.json cannot be read: listed as such, never hiding the others.
UNREADABLE = "UNREADABLE"


def read_run_summary(run: RunDir) -> dict[str, Any]:
    """A run's summary with its live status; a corrupt or foreign summary.json gives a row that
    says so (status UNREADABLE, the reason in `error`) instead of stopping the listing."""
    try:
        summary = run.read_summary()
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = f"{type(exc).__name__}: {exc}"
        return {"run_id": run.name, "status": UNREADABLE, "error": f"summary.json unreadable ({reason})"}
    if not isinstance(summary, dict):
        kind = type(summary).__name__
        return {
            "run_id": run.name,
            "status": UNREADABLE,
            "error": f"summary.json holds a {kind}, not an object",
        }
    summary.setdefault("run_id", run.name)
    summary["status"] = live_status(summary)
    return summary


def load_summaries(settings: Settings) -> list[dict[str, Any]]:
    return [read_run_summary(run) for run in RunDir.all(settings) if run.summary.exists()]


SORTS = ("started", "accuracy", "method", "domain", "status", "id")


def _accuracy(summary: dict[str, Any]) -> float:
    after = summary.get("student_after") or {}
    value = after.get("accuracy", after.get("score")) if isinstance(after, dict) else None
    return float(value) if isinstance(value, int | float) else float("-inf")


def select_runs(
    summaries: list[dict[str, Any]],
    domain: str | None = None,
    method: str | None = None,
    status: str | None = None,
    sort: str = "started",
) -> list[dict[str, Any]]:
    """Filter by domain/method/status (exact, status case-insensitive) and sort; best accuracy first."""
    out = [
        s
        for s in summaries
        if (domain is None or s.get("domain") == domain)
        and (method is None or s.get("method") == method)
        and (status is None or str(s.get("status", "")).upper() == status.upper())
    ]
    if sort == "accuracy":
        return sorted(out, key=lambda s: (-_accuracy(s), s.get("started", "")))
    field = {"id": "run_id"}.get(sort, sort)
    # Ties keep start order, so `--sort method` lists each method's runs oldest first.
    return sorted(out, key=lambda s: (str(s.get(field, "")), str(s.get("started", ""))))


def list_runs(
    as_json: bool,
    domain: str | None = None,
    method: str | None = None,
    status: str | None = None,
    sort: str = "started",
) -> None:
    every = load_summaries(get_settings())
    summaries = select_runs(every, domain, method, status, sort)
    if as_json:
        print(json.dumps(summaries, indent=2))
        return
    if not summaries:
        if every:
            console.print(f"no runs match the filters ({len(every)} runs in all)")
        else:
            console.print("no runs yet: try `distill run --domain rlve --method opd`")
        return
    table = Table(title="runs")
    for col in ("id", "domain", "method", "student", "teacher", "status", "before", "after", "teacher acc"):
        table.add_column(col)
    for s in summaries:
        if s["status"] == UNREADABLE:
            table.add_row(str(s["run_id"]), "", "", "", "", f"[red]{UNREADABLE}[/red]", "", "", "")
            continue
        table.add_row(
            str(s["run_id"]),
            str(s.get("domain", "")),
            str(s.get("method", "")),
            str(s.get("student", "")),
            str(s.get("teacher", "")),
            str(s["status"]),
            _pct(s.get("student_before")),
            _pct(s.get("student_after")),
            _pct(s.get("teacher_score")),
        )
    console.print(table)
    for s in summaries:
        if s["status"] == UNREADABLE:
            console.print(f"{s['run_id']}: {s['error']}", markup=False, highlight=False)


def zoo_build(names: list[str], domain: str) -> None:
    from distill.config import domain_config
    from distill.zoo.build import ensure_built, read_entry
    from distill.zoo.recipes import RECIPES

    settings = get_settings()
    cfg = domain_config(domain)
    for name in names or list(RECIPES):
        path = ensure_built(settings.zoo_path, name, cfg)
        entry = read_entry(path)
        acc = entry.eval.get("accuracy") if entry else None
        extra = f"  accuracy {acc:.1%}" if acc is not None else ""
        console.print(f"zoo:{name}  {path}{extra}")


def zoo_ls() -> None:
    from distill.zoo.build import read_entry

    root = get_settings().zoo_path
    table = Table(title=f"zoo ({root})")
    for col in ("name", "domain", "key", "params", "accuracy", "build s"):
        table.add_column(col)
    for path in sorted(root.glob("*/*")) if root.exists() else []:
        entry = read_entry(path) if path.is_dir() else None
        if entry is None:
            continue
        table.add_row(
            f"zoo:{entry.name}",
            entry.domain,
            entry.key,
            f"{entry.params:,}",
            _pct(entry.eval),
            f"{entry.seconds:.0f}",
        )
    console.print(table)
