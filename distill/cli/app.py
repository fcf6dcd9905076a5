"""The `distill` command. Thin: parse, call the library, print. Heavy imports happen inside commands."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from distill import __version__
from distill.cli.archive import archive_app, reproduce
from distill.cli.bridge import bridge_app
from distill.cli.common import fail
from distill.cli.serve import serve_app
from distill.cli.zoo import zoo_app

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.settings import Settings

app = typer.Typer(
    name="distill",
    help="Run, track, diagnose and archive LLM distillation experiments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"distill {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    # Telemetry off by default: runs happen on clusters and laptops without network.
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # Spin-waiting OpenMP threads make CPU steps several times slower under load.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Train + eval + log + checkpoint one run. Trailing KEY=VALUE arguments override the config "
    "(e.g. optim.lr=1e-5 optim.max_steps=20).",
)
def run(
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides, e.g. optim.lr=1e-5")
    ] = None,
    domain: Annotated[str | None, typer.Option(help="rlve | dapo | sciworld; rlve,dapo: both")] = None,
    method: Annotated[str | None, typer.Option(help="sft | opd | opsd | rose")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="a YAML config file")] = None,
    resume: Annotated[
        str | None, typer.Option(help="continue a run (id or path) from its last checkpoint")
    ] = None,
    student: Annotated[str | None, typer.Option(help="student model: zoo:<name>, a path or a hub id")] = None,
    teacher: Annotated[
        list[str] | None,
        typer.Option(
            help="teacher model: zoo:<name>, a path or a hub id; DOMAIN=MODEL names one domain's "
            "teacher (repeat it for each domain of a --domain rlve,dapo run)"
        ),
    ] = None,
    preflight: Annotated[
        bool, typer.Option("--preflight", help="only check prompts, templates and masks; train nothing")
    ] = False,
    launcher: Annotated[
        str | None, typer.Option(help="accelerate: train in several processes (see configs/accelerate/)")
    ] = None,
    accelerate_config: Annotated[
        Path | None, typer.Option("--accelerate-config", help="accelerate config file (DDP, ZeRO-3, FSDP)")
    ] = None,
    num_processes: Annotated[
        int | None, typer.Option("--num-processes", help="training processes (with --launcher accelerate)")
    ] = None,
) -> None:
    from distill.settings import get_settings

    settings = get_settings()
    try:
        overrides = [*(overrides or []), *model_overrides(student, teacher or [])]
    except ValueError as exc:
        raise fail(str(exc)) from None
    if resume is not None and (domain or method or config or overrides):
        raise fail("--resume takes the run's saved config; drop the other options")
    cfg = None if resume is not None else _new_config(domain, method, config, overrides)
    if resume is not None and _finished(settings, resume):
        return
    if launcher is not None or accelerate_config is not None or num_processes is not None:
        from distill.launch import exec_accelerate, refusal

        try:  # replaces this process by `accelerate launch ... -m distill run ...`
            exec_accelerate(
                launcher,
                sys.argv[1:],
                accelerate_config,
                num_processes,
                preflight,
                check=lambda plan: refusal(plan, cfg, settings, resume),
            )
        except ValueError as exc:
            raise fail(str(exc)) from None
    if preflight:
        _preflight_only(cfg, settings)
        return
    _execute(cfg, settings, resume)


def _execute(cfg: RunConfig | None, settings: Settings, resume: str | None) -> None:
    """The run, its end as one line and an exit code, then its summary (rank 0)."""
    from distill.cli.report import print_run_summary
    from distill.config import ConfigError
    from distill.launch import is_main_process
    from distill.requeue import StopForRequeue
    from distill.runner import execute
    from distill.tracking.rundir import RunRefused

    try:
        summary = execute(cfg, settings, argv=sys.argv, resume=resume, say=typer.echo)
    except (ConfigError, RunRefused) as exc:  # refused before anything was written
        raise fail(str(exc)) from None
    except StopForRequeue as exc:  # a SLURM cell's time limit or preemption, not a kill
        raise fail(f"{exc}; the requeued job continues it with --resume", 130) from None
    except KeyboardInterrupt:
        raise fail("interrupted; the run is marked KILLED and can be continued with --resume", 130) from None
    except Exception as exc:
        raise fail(f"run failed: {type(exc).__name__}: {exc} (traceback in the run's error.log)", 1) from None
    if is_main_process():  # the other ranks of a multi-process run only trained
        print_run_summary(summary, settings)


def model_overrides(student: str | None, teachers: list[str]) -> list[str]:
    """`--student MODEL` -> student.name; `--teacher MODEL` -> teacher.name; `--teacher
    DOMAIN=MODEL` -> teachers.DOMAIN.name (a domain named twice is refused: two teachers for one
    domain)."""
    from distill import registry

    out: list[str] = [f"student.name={student}"] if student else []
    seen: set[str] = set()
    for value in teachers:
        domain, sep, model = value.partition("=")
        if sep and domain in registry.DOMAINS:
            if domain in seen:
                raise ValueError(f"--teacher: two teachers for {domain}; give each domain's teacher once")
            seen.add(domain)
            out.append(f"teachers.{domain}.name={model}")
        else:
            out.append(f"teacher.name={value}")
    if len(teachers) - len(seen) > 1:
        raise ValueError(
            "--teacher: two teachers without a domain; name one, or DOMAIN=MODEL for each domain"
        )
    return out


def _new_config(
    domain: str | None, method: str | None, config: Path | None, overrides: list[str]
) -> RunConfig:
    """The run's config, checked against what its engines can do: one line, exit 2, otherwise."""
    from distill.config import ConfigError, resolve_config
    from distill.engines.compat import check_config

    try:
        cfg = resolve_config(domain, method, config, overrides)
        check_config(cfg)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    return cfg


def _preflight_only(cfg: RunConfig | None, settings: Settings) -> None:
    from distill.config import ConfigError
    from distill.methods.preflight import PreflightError
    from distill.prepare import preflight_only

    if cfg is None:
        raise fail("--preflight checks a new config; it does not combine with --resume")
    try:
        preflight_only(cfg, settings, say=typer.echo)
    except PreflightError as exc:
        raise fail(f"preflight failed: {exc}") from None
    except ConfigError as exc:  # a model, template, pair or device that cannot run, as `run` says it
        raise fail(str(exc)) from None
    except Exception as exc:  # nothing was written: the one line is the whole record
        raise fail(f"preflight could not run: {type(exc).__name__}: {exc}", 1) from None
    typer.echo("preflight passed")


def _finished(settings: Settings, resume: str) -> bool:
    """`--resume` of a FINISHED run: one line, nothing run again (its final eval included). An
    unknown run is bad input: one line, exit 2, nothing written."""
    from distill.runner import finished_note
    from distill.tracking.rundir import RunDir, RunRefused

    try:
        note = finished_note(RunDir.find(settings, resume))
    except RunRefused as exc:
        raise fail(str(exc)) from None
    if note is not None:
        typer.echo(note)
    return note is not None


@app.command(
    name="eval",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Evaluate a model (zoo:<name>, path, hub id or run checkpoint) on a domain. Trailing KEY=VALUE "
    "arguments set domain.* and eval.* fields as for `run` (e.g. domain.environments=[Division,LCM] "
    "domain.eval_seed=7 eval.items=50); options given explicitly win over them.",
)
def eval_cmd(
    model: Annotated[
        str, typer.Option(help="zoo:<name>, a local path, a hub id, or runs/<id>/checkpoints/step-N")
    ],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: domain.* and eval.*")
    ] = None,
    domain: Annotated[str | None, typer.Option(help="rlve | dapo | sciworld (default rlve)")] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="a YAML config (e.g. a run's): its domain and eval sections"),
    ] = None,
    n: Annotated[
        int | None, typer.Option("-n", help="samples per item (k); default 1, or the protocol's")
    ] = None,
    items: Annotated[int | None, typer.Option(help="eval items (default 200)")] = None,
    temperature: Annotated[
        float | None, typer.Option(help="default: the protocol's, else 0 for n=1 and 0.7 otherwise")
    ] = None,
    max_new_tokens: Annotated[
        int | None, typer.Option(help="response token budget; default the protocol's, else 64")
    ] = None,
    benchmark: Annotated[str | None, typer.Option(help="aime25 | hmmt25 | aime24 (--domain dapo)")] = None,
    data: Annotated[
        str | None, typer.Option(help="the benchmark's problems: a local file or folder (default: hub id)")
    ] = None,
    protocol: Annotated[
        str | None, typer.Option(help="reference (default with --benchmark) | opsd: n, sampling, thinking")
    ] = None,
    top_p: Annotated[float | None, typer.Option(help="default: the protocol's, else 1.0")] = None,
    thinking: Annotated[
        bool | None, typer.Option("--thinking/--no-thinking", help="enable_thinking in the chat template")
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="sciworld: simulator workers (JVMs), episodes in flight; default 2")
    ] = None,
    experiment: Annotated[
        str | None,
        typer.Option(help="MLflow experiment; default the checkpoint's training run's, else 'distill'"),
    ] = None,
) -> None:
    from distill.cli.evaluate import eval_command
    from distill.config.files import resolve_eval_config
    from distill.evals.standalone import EvalRequest

    try:
        name, domain_fields, ev = resolve_eval_config(domain, config, overrides)
        request = EvalRequest(
            model=model,
            domain=name,
            items=items if items is not None else ev.get("items", 200),
            n=n if n is not None else ev.get("k"),
            temperature=temperature if temperature is not None else ev.get("temperature"),
            top_p=top_p if top_p is not None else ev.get("top_p"),
            max_new_tokens=max_new_tokens if max_new_tokens is not None else ev.get("max_new_tokens"),
            thinking=thinking,
            benchmark=benchmark,
            data=data,
            protocol=protocol,
            workers=workers,
            experiment=experiment,
            domain_fields=domain_fields,
            batch_size=ev.get("batch_size"),
            overlong=ev.get("overlong", "fail"),
        )
        eval_command(request)
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None


@app.command(
    help="List runs: id, domain, method, student, teacher, status, final scores. --repair [RUN]: a run "
    "whose process died while RUNNING (SIGKILL, out of memory) is marked DIED, its MLflow run brought "
    "level with metrics.jsonl and its files logged (RUN: that run, whatever its status)."
)
def runs(
    run: Annotated[
        str | None, typer.Argument(help="with --repair: the run to repair (default: every run that died)")
    ] = None,
    repair: Annotated[
        bool, typer.Option("--repair", help="bring runs that died (or RUN) to a full record in MLflow")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print summary.json of every run as JSON")] = False,
    domain: Annotated[str | None, typer.Option(help="only runs of this domain")] = None,
    method: Annotated[str | None, typer.Option(help="only runs of this method")] = None,
    status: Annotated[
        str | None, typer.Option(help="only runs with this status (FINISHED, FAILED, KILLED, RUNNING, DIED)")
    ] = None,
    sort: Annotated[
        str, typer.Option(help="started | accuracy (best first) | method | domain | status | id")
    ] = "started",
) -> None:
    from distill.cli.report import SORTS, list_runs

    if run is not None and not repair:
        raise fail(f"a run ({run!r}) is given only with --repair; `distill runs` lists them all")
    if repair:
        from distill.runner import repair_runs
        from distill.settings import get_settings
        from distill.tracking.rundir import RunRefused

        try:
            code = repair_runs(get_settings(), run, typer.echo)
        except RunRefused as exc:
            raise fail(str(exc)) from None
        raise typer.Exit(code)
    if sort not in SORTS:
        raise fail(f"unknown --sort {sort!r}; choose one of {', '.join(SORTS)}")
    list_runs(as_json, domain=domain, method=method, status=status, sort=sort)


@app.command(
    help="Find out why a run went wrong: findings ranked by severity, each with the numbers behind it, "
    "why it matters and the config change that fixes it. Writes <run>/diagnose/ (report.json, report.md, "
    "PNG plots) and logs it to the run's MLflow run. Exit code: 0 nothing above info, 1 warnings, "
    "2 errors, 3 incomplete (a rule crashed; the others' findings stand); a missing or unreadable run "
    "prints one `error:` line and exits 2."
)
def diagnose(
    runs: Annotated[list[str], typer.Argument(help="run ids, unique id prefixes or run directories")],
    fmt: Annotated[str, typer.Option("--format", help="text | json | markdown")] = "text",
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="write PNG plots under <run>/diagnose/")
    ] = True,
    mlflow: Annotated[
        bool, typer.Option("--mlflow/--no-mlflow", help="log <run>/diagnose/ to the run's MLflow run")
    ] = True,
) -> None:
    from distill.cli.diagnose import diagnose_command

    try:
        code = diagnose_command(runs, fmt, plots, mlflow)
    except ValueError as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(code)


@app.command(
    help="Put runs side by side: domain, method, student, teacher, steps and final eval scores "
    "(avg@k, pass@k, solved; Score/Success/Pass(>0) where logged), best per column marked, deltas "
    "against a baseline run, and a PNG of the eval curves."
)
def compare(
    runs: Annotated[
        list[str] | None, typer.Argument(help="run ids, unique id prefixes or run directories")
    ] = None,
    grid: Annotated[
        str | None, typer.Option(help="a grid id or folder: print its domain x method table again")
    ] = None,
    baseline: Annotated[
        str | None, typer.Option(help="the run deltas are taken against (default: the first)")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | markdown | csv | json")] = "table",
    plot: Annotated[
        Path | None, typer.Option(help="PNG of eval curves (default: <workspace>/compare/)")
    ] = None,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="skip the eval-curve plot")] = False,
) -> None:
    if grid is not None:
        if runs:
            raise fail("--grid prints a grid's table; give it without run ids")
        from distill.cli.grid import compare_grid

        raise typer.Exit(compare_grid(grid))
    if not runs:
        raise fail("give run ids to compare, or --grid <id>")
    from distill.cli.diagnose import compare_command

    try:
        code = compare_command(runs, baseline, fmt, plot, no_plot)
    except ValueError as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(code)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Run the domain x method table: every cell an ordinary run with a matched budget (the same "
    "steps, prompts per step, samples and eval items per domain), each an MLflow child of one grid "
    "run. Prints the table (mean ± std over seeds, best per column in bold), the diagnose findings "
    "per cell, and writes table.md, table.csv and grid.png to <workspace>/grids/<id>/. Trailing "
    "KEY=VALUE overrides go to every cell (e.g. optim.max_steps=50 eval.items=100); METHOD:KEY=VALUE or "
    "DOMAIN:KEY=VALUE to one method's or domain's cells (e.g. rose:method.teacher_max_tokens=32). "
    "--executor slurm submits each cell as a SLURM job (settings: --settings FILE with a slurm: "
    "section, or slurm.KEY=VALUE); `distill grid status <grid>` follows the jobs.",
)
def grid(
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides for every cell, or scoped: sft:key=value")
    ] = None,
    domain: Annotated[str, typer.Option(help="comma-separated: rlve,dapo,sciworld")] = "rlve",
    method: Annotated[str, typer.Option(help="comma-separated: sft,opd,rose,opsd")] = "sft,opd,rose,opsd",
    seeds: Annotated[int, typer.Option(help="seeds per cell (seed=0..N-1)")] = 1,
    skip: Annotated[
        list[str] | None, typer.Option(help="a domain/method cell to leave out (repeatable)")
    ] = None,
    name: Annotated[str | None, typer.Option(help="the grid id (default grid-<date>-<time>)")] = None,
    parallel: Annotated[int, typer.Option(help="cells at a time, each in its own process")] = 1,
    resume: Annotated[
        str | None, typer.Option(help="continue a grid: FINISHED cells kept, died cells resumed")
    ] = None,
    executor: Annotated[str, typer.Option(help="local (processes here) | slurm (a job per cell)")] = "local",
    settings: Annotated[
        Path | None, typer.Option("--settings", help="YAML with the grid's slurm: section")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="slurm: wait for the jobs, then print the table")
    ] = False,
) -> None:
    from distill.cli.grid import grid_command, status_command

    words = list(overrides or [])
    if words[:1] == ["status"]:  # `distill grid status <grid> [--wait]`
        if len(words) != 2:
            raise fail("grid status: give one grid id or folder")
        raise typer.Exit(status_command(words[1], wait))
    runs = [w for w in words if not w.startswith("slurm.")]
    explicit = runs or skip or name or seeds != 1 or domain != "rlve" or method != "sft,opd,rose,opsd"
    if resume is not None and (explicit or executor != "local"):
        raise fail(
            "--resume takes the grid's saved plan; drop the other options (--parallel, --wait and slurm settings stay)"
        )
    code = grid_command(
        domain,
        method,
        seeds,
        words,
        list(skip or []),
        name,
        parallel,
        resume,
        sys.argv,
        executor,
        settings,
        wait,
    )
    raise typer.Exit(code)


app.add_typer(archive_app, name="archive")
app.add_typer(bridge_app, name="bridge")
app.add_typer(serve_app, name="serve")
app.command(name="reproduce")(reproduce)

app.add_typer(zoo_app, name="zoo")


def main() -> None:
    # A shell asking for completions (`eval "$(_DISTILL_COMPLETE=source_bash distill)"` in a
    # bashrc): typer's completion classes, registered only then, so `--help` stays as it is.
    if "_DISTILL_COMPLETE" in os.environ:
        from typer.completion import completion_init

        completion_init()
    app(prog_name="distill")


if __name__ == "__main__":
    main()
