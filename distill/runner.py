"""The path of one run: config -> domain -> engines -> eval before -> method -> eval after -> summary.

The run directory (`tracking.rundir.RunDir`) and the MLflow run are written side by side;
`summary.json` is the small record `distill runs` lists. A run that raises is marked FAILED with
its error (in both places), an interrupted one KILLED; none is left RUNNING by an exception.
Under `accelerate launch` every process runs `execute`: rank 0 owns the run directory and the
MLflow run, the other ranks train the run it created (`train_worker`).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill import __version__, launch
from distill.config import ModelConfig, RunConfig, dump_config, flatten
from distill.tracking.rundir import RunDir, new_run_id, resolve_tracking_uri

if TYPE_CHECKING:
    from distill.domains.base import Domain
    from distill.engines.base import Engine
    from distill.engines.hf import HFEngine
    from distill.evals.single_turn import EvalResult
    from distill.methods.context import RunContext
    from distill.settings import Settings
    from distill.tracking.base import Tracker

Say = Callable[[str], Any]  # prints a line for the user


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def execute(
    config: RunConfig | None,
    settings: Settings,
    argv: list[str] | None = None,
    resume: str | None = None,
    say: Say = print,
    callbacks: Sequence[Any] = (),
) -> dict[str, Any]:
    """Run `config` (or continue run `resume` from its last checkpoint); returns its summary.
    `callbacks`: extra transformers TrainerCallbacks for the method's trainer."""
    from distill.engines.compat import check_config

    # Under `accelerate launch` every process runs this: rank 0 owns the run dir and MLflow run.
    launch.init_distributed()
    if not launch.is_main_process():
        return train_worker(settings)
    argv = argv if argv is not None else sys.argv
    if resume is not None:
        run = RunDir.find(settings, resume)
        config = run.read_config()
        summary = run.read_summary()
        resume_from = run.last_checkpoint()
        run.trim_metrics(int(resume_from.name[5:]) if resume_from else 0)
        summary.setdefault("tracking_uri", resolve_tracking_uri(config, settings))
        say(f"resuming {run.name} from {resume_from.name if resume_from else 'the start'}")
    else:
        if config is None:
            raise ValueError("execute: give a config or a run to resume")
        check_config(config, check_install=True)  # before anything exists on disk
        run = RunDir.create(
            settings.runs_dir, config.tracking.run_name or new_run_id(config.domain.name, config.method.name)
        )
        dump_config(config, run.config)
        summary, resume_from = {"tracking_uri": resolve_tracking_uri(config, settings)}, None
    summary.update(
        run_id=run.name,
        status="RUNNING",
        domain=config.domain.name,
        method=config.method.name,
        student=config.student.name,
        teacher=config.teacher.name,
        run_dir=str(run.path.resolve()),
        pid=os.getpid(),
        started=summary.get("started", _now()),
        distill_version=__version__,
    )
    run.write_summary(summary)
    tracker = _open_tracker(config, settings, run, summary)
    summary["mlflow_run_id"] = tracker.run_id
    run.write_summary(summary)
    # The other ranks start only once the run exists in both places (a rank failing early must not
    # get rank 0 killed in the middle of creating the MLflow store).
    launch.broadcast((str(run.path), str(resume_from) if resume_from else None))
    domains: list[Domain] = []  # closed below, also on error / Ctrl-C: a domain may hold simulators
    try:
        _train_and_evaluate(
            Job(config, settings, run, tracker, summary, resume_from, argv, say, callbacks), domains
        )
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        # A SIGTERM from the launcher can surface wrapped (e.g. inside a lazy import): name it.
        summary.update(status=status, error=launch.stopped_message() or f"{type(exc).__name__}: {exc}")
        run.error_log.write_text(traceback.format_exc())
        summary["finished"] = _now()
        run.write_summary(summary)
        tracker.finish(status, error=summary["error"])
        raise
    finally:
        for domain in domains:
            domain.close()
    summary.update(status="FINISHED", finished=_now())
    summary.pop("error", None)
    run.write_summary(summary)
    _diagnose_at_end(run, tracker, summary, say)
    run.write_summary(summary)
    tracker.log_artifact(run.summary)
    tracker.finish("FINISHED")
    return summary


@dataclass
class Job:
    """One run in progress: what `_train_and_evaluate` and its helpers share."""

    config: RunConfig
    settings: Settings
    run: RunDir
    tracker: Tracker
    summary: dict[str, Any]
    resume_from: Path | None
    argv: list[str]
    say: Say
    callbacks: Sequence[Any] = ()


def _diagnose_at_end(run: RunDir, tracker: Tracker, summary: dict[str, Any], say: Say) -> None:
    """The diagnose summary of DESIGN's run path: findings in summary.json, report and plots logged."""
    try:
        from distill.diagnose.findings import Severity
        from distill.diagnose.records import load_run
        from distill.diagnose.report import build_report

        report = build_report(load_run(run.path))
    except Exception as exc:  # a diagnosis that fails must not fail a finished run
        say(f"diagnose: skipped ({type(exc).__name__}: {exc})")
        return
    if run.diagnose.is_dir():
        tracker.log_artifact(run.diagnose, "diagnose")
    summary["diagnose"] = {
        "counts": report.counts(),
        "findings": [f.name for f in report.findings if f.severity >= Severity.WARNING],
    }


def _open_tracker(config: RunConfig, settings: Settings, run: RunDir, summary: dict[str, Any]) -> Tracker:
    from distill.tracking.mlflow import git_tags, open_tracker

    tags = {
        "domain": config.domain.name,
        "method": config.method.name,
        "student": config.student.name,
        "teacher": config.teacher.name,
        "distill.version": __version__,
        "distill.run_dir": str(run.path.resolve()),
        **git_tags(),
    }
    tracker = open_tracker(
        str(summary["tracking_uri"]),
        config.tracking.experiment,
        settings.artifact_root,
        run_name=run.name,
        resume_run_id=summary.get("mlflow_run_id"),
        tags=tags,
    )
    if not summary.get("mlflow_run_id"):
        tracker.log_params(flatten(config.model_dump(mode="json")))
    return tracker


def load_engine(spec: ModelConfig, config: RunConfig, settings: Settings) -> Engine:
    """The student's or teacher's engine: a zoo name is built on first use."""
    from distill.zoo import resolve_model

    path = resolve_model(spec.name, config.domain, settings)
    if spec.engine == "server":  # engines/compat.py has checked the method can use a served teacher
        from distill.engines.server import ServerEngine

        return ServerEngine.load(path, str(spec.url), spec.server, spec.enable_thinking)
    from distill.engines.hf import HFEngine

    return HFEngine.load(path, spec.precision, spec.enable_thinking)


def load_student(config: RunConfig, settings: Settings) -> HFEngine:
    """The student trains in this process: always the hf engine (the config refuses a server)."""
    from distill.engines.hf import HFEngine

    engine = load_engine(config.student, config, settings)
    if not isinstance(engine, HFEngine):
        raise ValueError("student.engine: the student trains in this process (engine=hf)")
    return engine


def _prepare(
    config: RunConfig, settings: Settings
) -> tuple[Callable[[RunContext], None], Domain, HFEngine, Engine]:
    """What every process of a run does first: quiet libraries, seed, method, domain, engines."""
    import warnings

    import torch
    import transformers
    from transformers import set_seed

    from distill.domains import build_domain
    from distill.methods import get_method

    # Library deprecation chatter from inside TRL/transformers is not the user's to act on.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    set_seed(config.seed)
    train = get_method(config.method.name, config.domain.name)  # a method the domain lacks fails here
    domain = build_domain(config.domain)
    try:
        student = load_student(config, settings)
        teacher = load_engine(config.teacher, config, settings)
    except BaseException:
        domain.close()
        raise
    # After the engines load: a zoo build (inside load_engine) keeps torch's default threads, so
    # the cached zoo models are the same whatever `threads` a run asks for.
    if config.threads:
        torch.set_num_threads(config.threads)
    return train, domain, student, teacher


def _train_and_evaluate(job: Job, domains: list[Domain]) -> None:
    from distill.archive.manifest import build_manifest
    from distill.methods.context import RunContext
    from distill.tracking.steplog import StepLog

    config, run, tracker, summary, say = job.config, job.run, job.tracker, job.summary, job.say
    start = time.time()
    train, domain, student, teacher = _prepare(config, job.settings)
    domains.append(domain)
    _check_budgets(config, domain, student, teacher, summary, say)
    _preflight(config, domain, student, teacher, say)
    run.write_manifest(build_manifest(config, job.argv, tracker.run_id, student, teacher))
    tracker.log_artifact(run.config)
    tracker.log_artifact(run.manifest)
    log = StepLog(run, tracker)
    evaluate = _run_eval(job, domain, log)
    if "student_before" not in summary:
        summary["student_before"] = evaluate(student, "eval: student (before)", 0, "").metrics
        if config.eval.eval_teacher:
            summary["teacher_score"] = evaluate(teacher, "eval: teacher", 0, "teacher/").metrics
        run.write_summary(summary)
    say(_score_line("student before", summary["student_before"]))
    if "teacher_score" in summary:
        say(_score_line("teacher", summary["teacher_score"]))

    def evaluate_student(step: int, model: Any) -> EvalResult:
        from distill.engines.hf import HFEngine

        live = HFEngine(model, student.tokenizer, student.enable_thinking)
        return evaluate(live, f"eval: step {step}", step, "")

    ctx = RunContext(
        config, run, domain, student, teacher, log, job.resume_from, evaluate_student, callbacks=job.callbacks
    )
    say(f"training: {config.method.name} for {config.optim.max_steps} steps")
    train(ctx)
    student = ctx.student
    student.model.eval()
    summary["student_after"] = evaluate(student, "eval: student (after)", config.optim.max_steps, "").metrics
    summary["steps"] = config.optim.max_steps
    summary["seconds"] = round(time.time() - start + summary.get("seconds", 0.0), 1)
    tracker.set_tags({"checkpoint.final": str(run.checkpoint(config.optim.max_steps))})
    for folder in (run.eval, run.samples):
        if folder.exists():
            tracker.log_artifact(folder, folder.name)
    if run.metrics.exists():
        tracker.log_artifact(run.metrics)


def _run_eval(job: Job, domain: Domain, log: Any) -> Callable[[Engine, str, int, str], EvalResult]:
    """The run's eval: its items, written to `eval/` and logged under the domain's name."""
    from distill.evals import evaluator_for

    evaluate = evaluator_for(domain)
    config = job.config
    items = domain.eval_items()[: config.eval.items]

    def run_eval(engine: Engine, label: str, step: int, prefix: str) -> EvalResult:
        result = evaluate(engine, domain, items, config.eval, label)
        result.write(job.run.eval / f"{prefix}step-{step}.jsonl")
        log.write(step, {f"{prefix}{k}": v for k, v in result.named(config.domain.name).items()})
        return result

    return run_eval


def _check_budgets(
    config: RunConfig, domain: Domain, student: Engine, teacher: Engine, summary: dict[str, Any], say: Say
) -> None:
    """Token budgets against the models' contexts (engines/context.py): capped with a warning,
    kept in summary.json, or a one-line error before anything is generated."""
    from distill.methods.budget import context_checks

    warnings = [w for check in context_checks(config, domain, student, teacher) if (w := check.warning())]
    for warning in warnings:
        say(f"warning: {warning}")
    if warnings:
        summary["warnings"] = warnings


def _preflight(config: RunConfig, domain: Domain, student: HFEngine, teacher: Engine, say: Say) -> str | None:
    """Template / thinking / self-score checks for on-policy methods; raises PreflightError."""
    from distill.methods.preflight import run_preflight, teacher_view

    view = teacher_view(config, domain)
    if not config.preflight or view is None:
        return None
    prompt_for, same_template = view
    report = run_preflight(config, student, teacher, domain.train_items()[:2], prompt_for, same_template)
    text = report.render()
    say("preflight:\n" + text)
    return text


def preflight_only(config: RunConfig, settings: Settings, say: Say) -> str:
    """`distill run --preflight`: load the pair, run the checks, train nothing, write nothing."""
    from distill.domains import build_domain

    domain = build_domain(config.domain)
    try:
        student = load_student(config, settings)
        teacher = load_engine(config.teacher, config, settings)
        text = _preflight(config.model_copy(update={"preflight": True}), domain, student, teacher, say)
    finally:
        domain.close()
    if text is None:
        say(f"preflight: nothing to check for method {config.method.name} (no teacher scores student tokens)")
        return ""
    return text


def train_worker(settings: Settings) -> dict[str, Any]:
    """Ranks > 0: train the run rank 0 created; log, evaluate and checkpoint nothing themselves."""
    from distill.methods.context import RunContext
    from distill.tracking.base import NullTracker
    from distill.tracking.steplog import SilentLog

    where = launch.broadcast(None)
    run, resume_from = RunDir(Path(where[0])), (Path(where[1]) if where[1] else None)
    # The config rank 0 saved, so every rank trains exactly the same run (and the same on resume).
    config = run.read_config()
    try:
        train, domain, student, teacher = _prepare(config, settings)
    except BaseException:
        _worker_error(run)
        raise
    try:
        train(RunContext(config, run, domain, student, teacher, SilentLog(NullTracker()), resume_from))
    except BaseException:
        _worker_error(run)
        raise
    finally:
        domain.close()
    return {"run_id": run.name, "rank": launch.rank(), "status": "WORKER_DONE"}


def _worker_error(run: RunDir) -> None:
    # Rank 0 records its own failure in error.log; a worker's would otherwise be only on stderr.
    (run.path / f"error-rank{launch.rank()}.log").write_text(traceback.format_exc())


def _score_line(label: str, metrics: dict[str, float]) -> str:
    if "success" in metrics:  # multi-turn agent eval: the reference's three metrics
        return (
            f"{label}: Score {metrics['score']:.3f}, Success {metrics['success']:.1%}, "
            f"Pass(>0) {metrics['pass_gt0']:.1%} ({int(metrics['items'])} episodes)"
        )
    return f"{label}: accuracy {metrics['accuracy']:.1%} ({int(metrics['solved'])}/{int(metrics['items'])} solved)"
