"""The path of one run: config -> domain -> engines -> eval before -> method -> eval after -> summary.

The run directory (`<workspace>/runs/<run_id>/`) and the MLflow run are written side by side;
`summary.json` is the small record `distill runs` lists. A run that raises is marked FAILED with
its error (in both places), an interrupted one KILLED; none is left RUNNING by an exception.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill import __version__
from distill.archive.manifest import build_manifest
from distill.config import ModelConfig, RunConfig, dump_config, flatten, load_run_config

if TYPE_CHECKING:
    from distill.engines.hf import HFEngine
    from distill.evals.runner import EvalResult
    from distill.settings import Settings

Say = Any  # a callable(str) that prints for the user


def new_run_id(config: RunConfig) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{config.domain.name}-{config.method.name}-{secrets.token_hex(2)}"


def find_run_dir(settings: Settings, ref: str) -> Path:
    """A run by id, by unique id prefix, or by path."""
    path = Path(ref)
    if (path / "config.yaml").exists():
        return path
    candidate = settings.runs_dir / ref
    if (candidate / "config.yaml").exists():
        return candidate
    matches = sorted(settings.runs_dir.glob(f"{ref}*")) if settings.runs_dir.exists() else []
    matches = [m for m in matches if (m / "config.yaml").exists()]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ValueError(f"run {ref!r} is ambiguous: {', '.join(m.name for m in matches[:5])}")
    raise ValueError(f"no run {ref!r} under {settings.runs_dir}")


def read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def live_status(summary: dict[str, Any]) -> str:
    """The recorded status, except RUNNING by a process that no longer exists reads DIED."""
    status = str(summary.get("status", "?"))
    pid = summary.get("pid")
    if status == "RUNNING" and isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "DIED"  # killed without a chance to record it; `distill run --resume` continues it
        except PermissionError:
            pass
    return status


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, run_dir / "summary.json")


def _trim_metrics(run_dir: Path, last_step: int) -> None:
    """On resume, drop metric lines past the checkpoint: those steps are trained again."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def execute(
    config: RunConfig,
    settings: Settings,
    argv: list[str] | None = None,
    resume: str | None = None,
    say: Say = print,
) -> dict[str, Any]:
    from distill import launch
    from distill.methods.context import last_checkpoint

    # Under `accelerate launch` every process runs this: rank 0 owns the run dir and MLflow run.
    launch.init_distributed()
    if not launch.is_main_process():
        return launch.train_worker(settings)
    argv = argv if argv is not None else sys.argv
    if resume is not None:
        run_dir = find_run_dir(settings, resume)
        config = load_run_config(run_dir / "config.yaml")
        summary = read_summary(run_dir)
        resume_from = last_checkpoint(run_dir)
        _trim_metrics(run_dir, int(resume_from.name[5:]) if resume_from else 0)
        say(f"resuming {run_dir.name} from {resume_from.name if resume_from else 'the start'}")
    else:
        run_id = config.tracking.run_name or new_run_id(config)
        run_dir = settings.runs_dir / run_id
        if run_dir.exists():
            raise ValueError(f"run directory {run_dir} already exists; pick another tracking.run_name")
        run_dir.mkdir(parents=True)
        dump_config(config, run_dir / "config.yaml")
        summary = {}
        resume_from = None
    summary.update(
        {
            "run_id": run_dir.name,
            "status": "RUNNING",
            "domain": config.domain.name,
            "method": config.method.name,
            "student": config.student.name,
            "teacher": config.teacher.name,
            "run_dir": str(run_dir.resolve()),
            "pid": os.getpid(),
            "started": summary.get("started", datetime.now(UTC).isoformat(timespec="seconds")),
            "distill_version": __version__,
        }
    )
    write_summary(run_dir, summary)
    tracker = _open_tracker(config, settings, run_dir, summary)
    summary["mlflow_run_id"] = tracker.run_id
    summary["tracking_uri"] = config.tracking.uri or settings.resolved_tracking_uri
    write_summary(run_dir, summary)
    # The other ranks start only once the run exists in both places (a rank failing early must not
    # get rank 0 killed in the middle of creating the MLflow store).
    launch.share((str(run_dir), str(resume_from) if resume_from else None))
    domains: list[Any] = []  # closed below, also on error / Ctrl-C: a domain may hold simulators
    try:
        _train_and_evaluate(config, settings, run_dir, tracker, summary, resume_from, argv, say, domains)
    except BaseException as exc:
        import traceback

        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        # A SIGTERM from the launcher can surface wrapped (e.g. inside a lazy import): name it.
        summary.update(status=status, error=launch.stopped_message() or f"{type(exc).__name__}: {exc}")
        (run_dir / "error.log").write_text(traceback.format_exc())
        summary["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        write_summary(run_dir, summary)
        tracker.finish(status, error=summary["error"])
        raise
    finally:
        for domain in domains:
            domain.close()
    summary["status"] = "FINISHED"
    summary["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    summary.pop("error", None)
    write_summary(run_dir, summary)
    _diagnose_at_end(run_dir, tracker, summary, say)
    write_summary(run_dir, summary)
    tracker.log_artifact(run_dir / "summary.json")
    tracker.finish("FINISHED")
    return summary


def _diagnose_at_end(run_dir: Path, tracker: Any, summary: dict[str, Any], say: Say) -> None:
    """The diagnose summary of DESIGN's run path: findings in summary.json, report and plots logged."""
    try:
        from distill.diagnose.findings import Severity
        from distill.diagnose.records import load_run
        from distill.diagnose.report import build_report

        report = build_report(load_run(run_dir))
    except Exception as exc:  # a diagnosis that fails must not fail a finished run
        say(f"diagnose: skipped ({type(exc).__name__}: {exc})")
        return
    if (run_dir / "diagnose").is_dir():
        tracker.log_artifact(run_dir / "diagnose", "diagnose")
    summary["diagnose"] = {
        "counts": report.counts(),
        "findings": [f.name for f in report.findings if f.severity >= Severity.WARNING],
    }


def _open_tracker(config: RunConfig, settings: Settings, run_dir: Path, summary: dict[str, Any]) -> Any:
    from distill.tracking.mlflow import git_tags, open_tracker

    uri = config.tracking.uri or settings.resolved_tracking_uri
    tags = {
        "domain": config.domain.name,
        "method": config.method.name,
        "student": config.student.name,
        "teacher": config.teacher.name,
        "distill.version": __version__,
        "distill.run_dir": str(run_dir.resolve()),
        **git_tags(),
    }
    tracker = open_tracker(
        uri,
        config.tracking.experiment,
        settings.artifact_root,
        run_name=run_dir.name,
        resume_run_id=summary.get("mlflow_run_id"),
        tags=tags,
    )
    if not summary.get("mlflow_run_id"):
        tracker.log_params(flatten(config.model_dump(mode="json")))
    return tracker


def _load_engine(spec: ModelConfig, config: RunConfig, settings: Settings) -> HFEngine:
    from distill.engines.hf import HFEngine
    from distill.zoo import resolve_model

    path = resolve_model(spec.name, config.domain, settings)
    if spec.engine == "server":  # RunConfig has checked the method can use a served teacher
        from distill.engines.server import ServerEngine

        # Duck-typed as the hf engine's teacher interface (prompt_ids, score, score_topk, generate).
        return ServerEngine.load(path, str(spec.url), spec.server, spec.enable_thinking)  # type: ignore[return-value]
    return HFEngine.load(path, spec.precision, spec.enable_thinking)


def _train_and_evaluate(
    config: RunConfig,
    settings: Settings,
    run_dir: Path,
    tracker: Any,
    summary: dict[str, Any],
    resume_from: Path | None,
    argv: list[str],
    say: Say,
    domains: list[Any] | None = None,
) -> None:
    import warnings

    import torch
    import transformers
    from transformers import set_seed

    from distill.domains import build_domain
    from distill.methods import get_method
    from distill.methods.context import RunContext, StepLog, eval_metric_names

    # Library deprecation chatter from inside TRL/transformers is not the user's to act on.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    start = time.time()
    set_seed(config.seed)
    train = get_method(config.method.name, config.domain.name)  # a method the domain lacks fails here
    from distill.engines import vllm

    if reason := vllm.unsupported_reason(config):
        raise ValueError(reason)
    domain = build_domain(config.domain)
    if domains is not None:
        domains.append(domain)
    evaluate = _evaluator(domain)
    student = _load_engine(config.student, config, settings)
    teacher = _load_engine(config.teacher, config, settings)
    # After the engines load: a zoo build (inside _load_engine) keeps torch's default threads, so
    # the cached zoo models are the same whatever `threads` a run asks for.
    if config.threads:
        torch.set_num_threads(config.threads)
    _preflight(config, domain, student, teacher, say)
    manifest = build_manifest(config, argv, tracker.run_id, student, teacher)
    (run_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    tracker.log_artifact(run_dir / "config.yaml")
    tracker.log_artifact(run_dir / "manifest.json")
    bench = config.domain.name
    eval_items = domain.eval_items()[: config.eval.items]
    log = StepLog(run_dir, tracker)

    def run_eval(engine: HFEngine, label: str, step: int, prefix: str = "") -> EvalResult:
        result = evaluate(engine, domain, eval_items, config.eval, label=label)
        result.write(run_dir / "eval" / f"{prefix}step-{step}.jsonl")
        names = eval_metric_names(bench, result)
        log.write(step, {f"{prefix}{k}": v for k, v in names.items()})
        return result

    if "student_before" not in summary:
        summary["student_before"] = run_eval(student, "eval: student (before)", 0).metrics
        if config.eval.eval_teacher:
            summary["teacher_score"] = run_eval(teacher, "eval: teacher", 0, prefix="teacher/").metrics
        write_summary(run_dir, summary)
    say(_score_line("student before", summary["student_before"]))
    if "teacher_score" in summary:
        say(_score_line("teacher", summary["teacher_score"]))

    def evaluate_student(step: int, model: Any) -> EvalResult:
        from distill.engines.hf import HFEngine

        return run_eval(
            HFEngine(model, student.tokenizer, student.enable_thinking), f"eval: step {step}", step
        )

    ctx = RunContext(
        config=config,
        run_dir=run_dir,
        domain=domain,
        student=student,
        teacher=teacher,
        log=log,
        resume_from=resume_from,
        evaluate_student=evaluate_student,
    )
    say(f"training: {config.method.name} for {config.optim.max_steps} steps")
    train(ctx)
    student.model.eval()
    after = run_eval(student, "eval: student (after)", config.optim.max_steps)
    summary["student_after"] = after.metrics
    summary["steps"] = config.optim.max_steps
    summary["seconds"] = round(time.time() - start + summary.get("seconds", 0.0), 1)
    tracker.set_tags({"checkpoint.final": str(run_dir / "checkpoints" / f"step-{config.optim.max_steps}")})
    for folder in ("eval", "samples"):
        if (run_dir / folder).exists():
            tracker.log_artifact(run_dir / folder, folder)
    if (run_dir / "metrics.jsonl").exists():
        tracker.log_artifact(run_dir / "metrics.jsonl")


def _preflight(config: RunConfig, domain: Any, student: HFEngine, teacher: HFEngine, say: Say) -> str | None:
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
        student = _load_engine(config.student, config, settings)
        teacher = _load_engine(config.teacher, config, settings)
        text = _preflight(config.model_copy(update={"preflight": True}), domain, student, teacher, say)
    finally:
        domain.close()
    if text is None:
        say(f"preflight: nothing to check for method {config.method.name} (no teacher scores student tokens)")
        return ""
    return text


def _evaluator(domain: Any) -> Any:
    """The eval of a run on `domain`: single-turn responses, or episodes for a multi-turn domain."""
    if domain.multi_turn:
        from distill.evals.agent import evaluate_in_run

        return evaluate_in_run
    from distill.evals.runner import evaluate

    return evaluate


def _score_line(label: str, metrics: dict[str, float]) -> str:
    if "success" in metrics:  # multi-turn agent eval (sciworld): the reference's three metrics
        return (
            f"{label}: Score {metrics['score']:.3f}, Success {metrics['success']:.1%}, "
            f"Pass(>0) {metrics['pass_gt0']:.1%} ({int(metrics['items'])} episodes)"
        )
    return f"{label}: accuracy {metrics['accuracy']:.1%} ({int(metrics['solved'])}/{int(metrics['items'])} solved)"
