"""The path of one run: config -> domain -> engines -> eval before -> method -> eval after -> summary.

The run directory (`tracking.rundir.RunDir`) and the MLflow run are written side by side;
`summary.json` is the small record `distill runs` lists. One process writes a run at a time
(`tracking.lock`). A run that raises is marked FAILED with its error (in both places), an
interrupted one KILLED; none is left RUNNING by an exception, and every exit path logs the run's
files to MLflow. A resume gets a fresh MLflow run equal to the trimmed `metrics.jsonl`
(`tracking.record`); a SIGKILLed run is brought to the same record by `distill runs --repair`.
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
from distill.archive.manifest import build_manifest, check_same_start
from distill.config import ConfigError, RunConfig, dump_config
from distill.diagnose.causes import start_note
from distill.diagnose.findings import Severity
from distill.diagnose.records import load_run
from distill.diagnose.report import build_report
from distill.engines.compat import check_config
from distill.engines.hf import HFEngine
from distill.methods.context import RunContext, train_or_take_final
from distill.methods.preflight import PreflightError, failure_entry
from distill.prepare import budget_warnings, check_pair, device_note, model_devices, preflight, prepare
from distill.run_eval import RunEval, parts_recorder, step0_evals_to_redo
from distill.tracking.base import NullTracker
from distill.tracking.lock import RunLock
from distill.tracking.record import log_record, open_run_tracker
from distill.tracking.record import repair_runs as repair
from distill.tracking.rundir import RunDir, new_run_id, resolve_tracking_uri, step_of
from distill.tracking.steplog import SilentLog, StepLog
from distill.zoo.check import build_inputs, check_models

if TYPE_CHECKING:
    from distill.domains.base import Domain
    from distill.engines.base import Engine
    from distill.evals.single_turn import EvalResult
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
    `callbacks`: extra transformers TrainerCallbacks for the method's trainer. A bad run name,
    an unknown `resume` or a run another process is writing raise RunRefused before anything
    is written; resuming a FINISHED run changes nothing."""
    # Under `accelerate launch` every process runs this: rank 0 owns the run dir and MLflow run.
    launch.init_distributed()
    if not launch.is_main_process():
        return train_worker(settings)
    # A launch the config (or the checkpoint to resume) cannot train under: refused before anything
    # is written, as `distill run --launcher` refuses it before starting the processes.
    if reason := launch.refusal(launch.plan_here(), config, settings, resume):
        raise ConfigError(reason)
    argv = list(argv if argv is not None else sys.argv)
    if resume is not None:
        run = RunDir.find(settings, resume)
        lock = RunLock.acquire(run)  # one writer per run: a live one makes this a RunRefused
        note = finished_note(run)
        if note is not None:
            lock.release()
            say(note)
            return run.read_summary()
    else:
        if config is None:
            raise ValueError("execute: give a config or a run to resume")
        check_config(config, check_install=True)  # before anything exists on disk
        check_models(config)  # a typo'd model fails in a second, not after a run dir exists
        check_pair(config, settings)  # a pair whose tokenizers the method cannot cross, too
        model_devices(config)  # and a device the machine lacks
        build_inputs(config, settings)  # items and zoo models: a failure there is the input's
        run = RunDir.create(
            settings.runs_dir, config.tracking.run_name or new_run_id(config.domain.name, config.method.name)
        )
        lock = RunLock.acquire(run)
        dump_config(config, run.config)
    with lock:
        return _execute(run, config, settings, argv, resume is not None, say, callbacks)


def finished_note(run: RunDir) -> str | None:
    """The one line `--resume` of a FINISHED run prints instead of running its final eval again."""
    try:
        if run.read_summary().get("status") != "FINISHED":
            return None
    except ValueError:  # an unreadable summary.json: the resume itself says what is wrong
        return None
    return f"run {run.name} is FINISHED; nothing to resume (`distill runs`, `distill diagnose {run.name}`)"


def _execute(
    run: RunDir,
    config: RunConfig | None,
    settings: Settings,
    argv: list[str],
    resuming: bool,
    say: Say,
    callbacks: Sequence[Any],
) -> dict[str, Any]:
    resume_from = None
    if resuming:
        config = run.read_config()
        summary = run.read_summary()
        resume_from = run.last_checkpoint()
        redo = step0_evals_to_redo(summary, config)
        run.trim_metrics(step_of(resume_from or "") or 0, config.optim.max_steps, redo)
        summary.setdefault("tracking_uri", resolve_tracking_uri(config, settings))
        # The manifest keeps the command that started the run; each resume is recorded beside it.
        summary.setdefault("argv", _manifest_argv(run) or argv)
        at = resume_from.name if resume_from else "the start"
        summary["resumes"] = [*summary.get("resumes", []), {"argv": argv, "at": _now(), "from": at}]
        say(f"resuming {run.name} from {at}")
        if note := launch.resume_note(resume_from, launch.plan_here()):
            say(note)
    else:
        assert config is not None
        summary = {"tracking_uri": resolve_tracking_uri(config, settings), "argv": argv}
    for stale in ("error", "finished"):  # how an earlier attempt ended
        summary.pop(stale, None)
    summary.update(
        run_id=run.name,
        status="RUNNING",
        domain=config.domain.name,
        method=config.method.name,
        student=config.student.name,
        # A teacher per domain: `rlve=zoo:teacher, dapo=<path>`.
        teacher=", ".join(f"{d}={t.name}" for d, t in config.teachers.items()) or config.teacher.name,
        run_dir=str(run.path.resolve()),
        pid=os.getpid(),
        started=summary.get("started", _now()),
        distill_version=__version__,
    )
    run.write_summary(summary)
    job = Job(config, settings, run, NullTracker(), summary, resume_from, summary["argv"], say, callbacks)
    domains: list[Domain] = []  # closed below, also on error / Ctrl-C: a domain may hold simulators
    try:
        job.tracker = _open_tracker(job, resuming)
        # The other ranks start only once the run exists in both places (a rank failing early must
        # not get rank 0 killed in the middle of creating the MLflow store).
        launch.broadcast((str(run.path), str(resume_from) if resume_from else None))
        _train_and_evaluate(job, domains)
    except BaseException as exc:
        _end_failed(job, exc)
        raise
    finally:
        for domain in domains:
            domain.close()
    summary.update(status="FINISHED", finished=_now())
    _end(job, "FINISHED")
    return summary


def _manifest_argv(run: RunDir) -> list[str] | None:
    """The first command of a run made before summary.json kept it (its manifest's)."""
    try:
        argv = run.read_manifest().get("argv")
    except ValueError:
        return None
    return list(argv) if isinstance(argv, list) else None


def _end_failed(job: Job, exc: BaseException) -> None:
    """FAILED (KILLED on Ctrl-C / SIGTERM), with the error, traceback and full record."""
    status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
    # A SIGTERM from the launcher can surface wrapped (e.g. inside a lazy import): name it.
    error = launch.stopped_message() or f"{type(exc).__name__}: {exc}"
    job.summary.update(status=status, error=error, finished=_now())
    job.run.error_log.write_text(traceback.format_exc())
    job.run.write_summary(job.summary)  # the outcome first: what follows may be slow, or fail
    _record_preflight_failure(job.run, exc)
    _end(job, status)


def _end(job: Job, status: str) -> None:
    """Every exit path: diagnosis, the run's files to MLflow, the MLflow run closed. A store that
    refuses costs a warning, never the run's outcome (nor hides its error)."""
    run, tracker, summary, say = job.run, job.tracker, job.summary, job.say
    run.write_summary(summary)  # the outcome first: diagnose reads it, and what follows may fail
    _diagnose_at_end(run, summary, say)
    run.write_summary(summary)
    log_record(run, tracker, say)
    try:
        tracker.finish(status, error=summary.get("error"))
    except Exception as exc:
        say(
            f"warning: MLflow run {tracker.run_id} not closed ({type(exc).__name__}: {exc}); "
            f"`distill runs --repair {run.name}` brings it level"
        )


def _record_preflight_failure(run: RunDir, exc: BaseException) -> None:
    """A first-batch preflight check (in the trainer) that stopped the run goes into preflight.json."""
    if not isinstance(exc, PreflightError) or exc.report is not None:
        return
    name, entry = failure_entry(exc)
    report = run.read_preflight()
    report.setdefault("checks", {})[name] = entry
    run.write_preflight(report)


def repair_runs(settings: Settings, ref: str | None, say: Say) -> int:
    """`distill runs --repair [RUN]` (`tracking.record.repair_runs`), with the run path's diagnosis."""
    return repair(settings, ref, say, _diagnose_at_end)


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


def _diagnose_at_end(run: RunDir, summary: dict[str, Any], say: Say) -> None:
    """The diagnose summary of DESIGN's run path: findings in summary.json, report and plots in
    `diagnose/` (logged with the run's other files)."""
    try:
        report = build_report(load_run(run.path))
    except Exception as exc:  # a diagnosis that fails must not fail a finished run
        say(f"diagnose: skipped ({type(exc).__name__}: {exc})")
        return
    summary["diagnose"] = {
        "counts": report.counts(),
        "findings": [f.name for f in report.findings if f.severity >= Severity.WARNING],
    }


def _open_tracker(job: Job, resuming: bool) -> Tracker:
    return open_run_tracker(
        job.config, job.settings, job.run, job.summary, job.resume_from, resuming, job.say
    )


def _train_and_evaluate(job: Job, domains: list[Domain]) -> None:
    config, run, tracker, summary, say = job.config, job.run, job.tracker, job.summary, job.say
    start = time.time()
    if note := device_note(config):
        say(note)
    prepared = prepare(config, job.settings)
    train, domain, student, teacher = prepared.train, prepared.domain, prepared.student, prepared.teacher
    domains.append(domain)
    warnings = budget_warnings(config, domain, student, teacher, prepared.teachers)
    for warning in warnings:
        say(f"warning: {warning}")
    if warnings:
        summary["warnings"] = warnings
    preflight(config, domain, student, teacher, say, run, prepared.teachers)
    run.write_manifest(_manifest(job, student, teacher, prepared.teachers))
    for path in (run.config, run.manifest, run.preflight):
        if path.exists():
            tracker.log_artifact(path)
    log = StepLog(run, tracker)
    evaluate = RunEval(config, run, domain, log)
    # Each step-0 eval is recorded as soon as it is done: a resume runs only those that were not
    # (their partial rows were trimmed, `step0_evals_to_redo`), so each point is logged once.
    if "student_before" not in summary:
        before = parts_recorder(summary, "student_before")
        summary["student_before"] = evaluate(student, "eval: student (before)", 0, "", before).metrics
        run.write_summary(summary)
    if config.eval.eval_teacher and "teacher_score" not in summary:
        teachers = prepared.teachers or teacher
        record = parts_recorder(summary, "teacher_score")
        summary["teacher_score"] = evaluate(teachers, "eval: teacher", 0, "teacher/", record).metrics
        run.write_summary(summary)
    say(_score_line("student before", summary["student_before"]))
    if "teacher_score" in summary:
        say(_score_line("teacher", summary["teacher_score"]))
    for part, scores in (summary.get("parts") or {}).items():
        say("  ".join(_score_line(f"{part} {k.replace('_', ' ')}", m) for k, m in scores.items()))
    if "teacher_score" in summary and (note := start_note(run.path)):
        say(note)  # a teacher below its student: the cause of what follows, said before training

    def evaluate_student(step: int, model: Any) -> EvalResult:
        live = HFEngine(model, student.tokenizer, student.enable_thinking)
        return evaluate(live, f"eval: step {step}", step, "")

    ctx = RunContext(
        config,
        run,
        domain,
        student,
        teacher,
        log,
        job.resume_from,
        evaluate_student,
        callbacks=job.callbacks,
        say=say,
        teachers=prepared.teachers,
    )
    say(f"training: {config.method.name} for {config.optim.max_steps} steps")
    student = train_or_take_final(ctx, train)
    student.model.eval()
    after = parts_recorder(summary, "student_after")
    summary["student_after"] = evaluate(
        student, "eval: student (after)", config.optim.max_steps, "", after
    ).metrics
    summary["steps"] = config.optim.max_steps
    summary["seconds"] = round(time.time() - start + summary.get("seconds", 0.0), 1)
    tracker.set_tags({"checkpoint.final": str(run.checkpoint(config.optim.max_steps))})


def _manifest(job: Job, student: Engine, teacher: Engine, teachers: dict[str, Engine]) -> dict[str, Any]:
    """The manifest of what the run started from. A resume keeps the start (model pins, git state,
    packages, hardware) and refuses models that changed since: the rest of the run would train
    against another teacher; its own git state and packages go under `resumes`."""
    cfg = job.config
    # Each model's device is read from its engine (a teacher's worker process says its own).
    manifest = build_manifest(cfg, job.argv, job.tracker.run_id, student, teacher, teachers)
    previous = job.run.read_manifest() if job.resume_from is not None and job.run.manifest.exists() else None
    if previous is not None:
        check_same_start(previous, manifest)
        resumes = job.summary.get("resumes", [])
        if resumes:
            resumes[-1].update(git=manifest["git"], packages=manifest["packages"])
        kept = ("start", "git", "packages", "hardware", "argv")
        manifest.update({k: previous[k] for k in kept if k in previous})
    if job.summary.get("resumes"):
        manifest["resumes"] = job.summary["resumes"]
    return manifest


def train_worker(settings: Settings) -> dict[str, Any]:
    """Ranks > 0: train the run rank 0 created; log, evaluate and checkpoint nothing themselves."""
    where = launch.broadcast(None)
    run, resume_from = RunDir(Path(where[0])), (Path(where[1]) if where[1] else None)
    # The config rank 0 saved, so every rank trains exactly the same run (and the same on resume).
    config = run.read_config()
    try:
        prepared = prepare(config, settings)
    except BaseException:
        _worker_error(run)
        raise
    try:
        # As rank 0 does: no training at all when the resume's checkpoint holds the last step.
        ctx = RunContext(
            config,
            run,
            prepared.domain,
            prepared.student,
            prepared.teacher,
            SilentLog(NullTracker()),
            resume_from,
            say=lambda _: None,
            teachers=prepared.teachers,
        )
        train_or_take_final(ctx, prepared.train)
    except BaseException:
        _worker_error(run)
        raise
    finally:
        prepared.domain.close()
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
