"""`distill archive push | pull | ls | verify` and `distill reproduce`. Thin: DVC, MLflow and torch are
imported inside the commands, through the library in `distill.archive`."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from distill.cli.common import console, fail

if TYPE_CHECKING:
    from pathlib import Path

    from distill.archive.reproduce import Reproduction
    from distill.archive.store import Check
    from distill.settings import Settings

archive_app = typer.Typer(
    help="Checkpoints, data, samples and manifests of runs in DVC-managed storage (DISTILL_REMOTE).",
    no_args_is_help=True,
)

JobsOption = Annotated[int | None, typer.Option("--jobs", "-j", help="parallel transfers (DVC's default)")]


def _run_path(settings: Settings, ref: str) -> Path:
    """A run's folder by id, unique prefix or path (a ValueError naming a typo). Imported here:
    the run folder reads configs, and `distill --help` must not load the config models."""
    from distill.tracking.rundir import RunDir

    return RunDir.find(settings, ref).path


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size} B"


def _errors() -> tuple[type[BaseException], ...]:
    try:
        from dvc.exceptions import DvcException
    except ImportError:  # open_archive says how to install it
        return (ValueError, OSError)
    return (ValueError, OSError, DvcException)


@archive_app.command("push", help="Archive runs (default: FINISHED runs not yet pushed to the remote).")
def push(
    runs: Annotated[list[str] | None, typer.Argument(help="run ids, unique prefixes or run dirs")] = None,
    jobs: JobsOption = None,
) -> None:
    from distill.archive.dvcrepo import open_archive
    from distill.archive.store import mlflow_tagger, push_run, unarchived_runs
    from distill.settings import get_settings

    settings = get_settings()
    try:
        named = [_run_path(settings, r) for r in runs or []]  # a typo fails before DVC is touched
        # Started before DVC opens its repo: MLflow's start-up then runs beside all of DVC's work.
        tagger = mlflow_tagger(named, settings.resolved_tracking_uri)
        archive = open_archive(settings)
        try:
            dirs = named or unarchived_runs(settings, archive.remote_url)
            if not dirs:
                typer.echo(f"nothing to archive: every finished run is already in {archive.remote_url}")
                return
            with tagger:
                for run_dir in dirs:
                    result = push_run(archive, run_dir, jobs=jobs, tagger=tagger)
                    outputs = result.record["outputs"]
                    size = sum(int(o.get("size") or 0) for o in outputs.values())
                    typer.echo(
                        f"{result.run_id}: {len(outputs)} outputs, {_size(size)}, {result.uploaded} files "
                        f"uploaded to {archive.remote_url}; hashes in manifest.json and {result.mlflow}"
                    )
        finally:
            tagger.close()
            archive.close()
    except _errors() as exc:
        raise fail(str(exc)) from None


def _print_checks(run_id: str, checks: list[Check]) -> bool:
    ok = all(c.ok for c in checks)
    for check in checks:
        if check.ok:
            state = "ok"
        elif check.actual is None:
            state = "MISSING"
        elif check.dvc != check.recorded:
            state = f"DRIFT (.dvc file says {check.dvc})"
        else:
            state = f"DRIFT (now {check.actual})"
        typer.echo(f"  {check.name:<14} {check.recorded:<40} {state}")
        for kind, paths in check.details.items():
            shown = ", ".join(paths[:8]) + (f" (+{len(paths) - 8} more)" if len(paths) > 8 else "")
            typer.echo(f"      {kind}: {shown}")
    typer.echo(f"{run_id}: {'verified' if ok else 'drift from the archived hashes'}")
    return ok


@archive_app.command(
    "pull",
    help="Restore a run's archived checkpoints and data, verified by hash; a run gone from this machine "
    "is re-created from its MLflow record (hashes and remote tags, config and summary artifacts).",
)
def pull(
    run: Annotated[str, typer.Argument(help="run id, unique prefix or run dir")], jobs: JobsOption = None
) -> None:
    from distill.archive.dvcrepo import open_archive
    from distill.archive.store import pull_run, read_record
    from distill.settings import get_settings

    settings = get_settings()
    try:
        try:
            run_dir = _run_path(settings, run)
            restored = False
        except ValueError as exc:
            if "ambiguous" in str(exc):
                raise
            # Gone from this machine: re-create it from its MLflow record, pulling from the remote
            # the push recorded unless DISTILL_REMOTE names another.
            from distill.archive.restore import restore_run_dir

            run_dir = restore_run_dir(settings, run)
            restored = True
            record = read_record(run_dir) or {}
            if settings.remote is None and record.get("remote_url"):
                settings = settings.model_copy(update={"remote": record["remote_url"]})
            typer.echo(
                f"{run}: re-created from {record.get('restored_from')}; pulling from {settings.remote}"
            )
        archive = open_archive(settings)
        try:
            checks = pull_run(archive, run_dir, jobs=jobs)
        finally:
            archive.close()
        if restored:
            from distill.archive.restore import finish_restore

            finish_restore(run_dir)
    except _errors() as exc:
        raise fail(str(exc)) from None
    if not _print_checks(run_dir.name, checks):
        raise typer.Exit(1)


@archive_app.command("verify", help="Re-hash a run's archived files and report drift. Exit 1 on drift.")
def verify(runs: Annotated[list[str], typer.Argument(help="run ids, unique prefixes or run dirs")]) -> None:
    from distill.archive.dvcrepo import open_archive
    from distill.archive.store import verify_run
    from distill.settings import get_settings

    settings = get_settings()
    ok = True
    try:
        dirs = [_run_path(settings, r) for r in runs]
        archive = open_archive(settings)
        try:
            for run_dir in dirs:
                ok = _print_checks(run_dir.name, verify_run(archive, run_dir)) and ok
        finally:
            archive.close()
    except _errors() as exc:
        raise fail(str(exc)) from None
    if not ok:
        raise typer.Exit(1)


@archive_app.command("ls", help="Archived runs with sizes, file counts and remotes.")
def ls(as_json: Annotated[bool, typer.Option("--json", help="one JSON list")] = False) -> None:
    from rich.table import Table

    from distill.archive.store import archived_runs
    from distill.settings import get_settings

    rows = archived_runs(get_settings())
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no archived runs (distill archive push)")
        return
    table = Table()
    for name in ("run", "status", "size", "files", "local", "remote", "pushed"):
        table.add_column(name, justify="right" if name in ("size", "files") else "left")
    for row in rows:
        table.add_row(
            row["run_id"],
            row["status"],
            _size(row["size"]),
            str(row["files"]),
            "yes" if row["local"] else "no",
            row["remote"],
            row["pushed_at"],
        )
    console().print(table)


def _print_reproduction(result: Reproduction) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        title=f"reproduce {result.run_id}" + (f" -> {result.new_run_id}" if result.new_run_id else "")
    )
    for name in ("eval", "metric", "original", "reproduced", "match"):
        table.add_column(name, justify="right" if name in ("original", "reproduced") else "left")
    for c in result.comparisons:
        again = "missing" if c.missing else f"{c.reproduced:.6g}"
        # `student_after [rlve]`: brackets are rich markup unless escaped.
        row = (escape(c.section), escape(c.metric), f"{c.original:.6g}", again, "yes" if c.match else "NO")
        table.add_row(*row)
    out = console()
    out.print(table)
    for note in result.notes:
        out.print(f"  note: {note}")
    verdict = "reproduced exactly" if result.match else "did NOT reproduce"
    out.print(f"{result.run_id}: {verdict}")


def reproduce(
    run: Annotated[str, typer.Argument(help="run id, unique prefix or run dir")],
    eval_only: Annotated[
        bool, typer.Option("--eval-only", help="re-evaluate the final checkpoint instead of re-training")
    ] = False,
) -> None:
    """Re-run a run from its manifest (same config, same seed) and report whether the eval numbers
    match exactly. Exit 0 on a match, 1 on a mismatch, 2 when the run cannot be reproduced."""
    from distill.archive.reproduce import prepare_rerun, reproduce_eval
    from distill.config import ConfigError
    from distill.runner import execute
    from distill.settings import get_settings

    settings = get_settings()
    try:
        run_dir = _run_path(settings, run)
        if eval_only:
            result = reproduce_eval(run_dir, say=typer.echo)
        else:
            rerun = prepare_rerun(run_dir)
            result = rerun.compare(execute(rerun.config, settings, argv=sys.argv, say=typer.echo))
    except (ConfigError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    except Exception as exc:
        raise fail(f"reproduction run failed: {type(exc).__name__}: {exc}", 1) from None
    _print_reproduction(result)
    if not result.match:
        raise typer.Exit(1)
