"""`distill eval`: one model on a domain's eval set or a benchmark, written and logged to MLflow.

With a math benchmark (aime25, hmmt25, aime24; the dapo domain) the problems come from `data` (a
file or folder in any layout `distill.domains.dapo.data` reads) or the benchmark's hub id, and the
sampling settings default to an eval protocol (`reference`: the reference documents' thinking
on, temperature 0.7, top_p 0.95, 31,744 new tokens, n=16; `opsd`: n=12, temperature 1.0, 38,912
tokens, thinking off). Settings given explicitly win over the protocol. On an episodic domain
the eval is one greedy episode per item with thinking off (SciWorld's AgentGym protocol:
`benchmark="agentgym"`: at most 20 turns and 4,096 tokens in a whole episode, each turn writing
up to what is left, as AgentGym's `max_length` bounds a conversation). A checkpoint of a run is
logged as a nested MLflow run under that run, in the store the run was logged to. Each
evaluation writes its own per-item file under `<workspace>/evals/` (named after the benchmark,
the run and checkpoint or model, k, the time and a random tag), so two runs' `step-N`, one model
under two protocols, or two evals at once never share one.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from distill import registry
from distill.config import EvalConfig, domain_config
from distill.domains import build_domain
from distill.engines.context import check_budget
from distill.engines.hf import HFEngine
from distill.engines.placement import place, this_machine
from distill.engines.templates import apply_chat_template
from distill.episodes.protocol import as_episodic
from distill.evals import evaluator_for
from distill.evals.agent import evaluate_agent
from distill.evals.overlong import fit_context, named
from distill.tracking.mlflow import open_tracker
from distill.tracking.rundir import RunDir

if TYPE_CHECKING:
    from distill.config import DomainBase
    from distill.domains.base import Domain, Item
    from distill.evals.single_turn import EvalResult
    from distill.settings import Settings
    from distill.tracking.rundir import RunDir


@dataclass(frozen=True)
class EvalProtocol:
    """Sampling settings of an eval protocol; a setting given explicitly wins over these."""

    k: int
    temperature: float
    top_p: float
    max_new_tokens: int
    enable_thinking: bool


PROTOCOLS: dict[str, EvalProtocol] = {
    # rose-opd-framework.md, DAPO-Math: AIME25 / HMMT25 avg@16, thinking, temp 0.7 / top_p 0.95.
    "reference": EvalProtocol(k=16, temperature=0.7, top_p=0.95, max_new_tokens=31744, enable_thinking=True),
    # opsd-self-distillation.md, AIME25 eval: --val-n 12 --max-tokens 38912 --temperature 1.0.
    "opsd": EvalProtocol(k=12, temperature=1.0, top_p=1.0, max_new_tokens=38912, enable_thinking=False),
}
# The AgentGym protocol on SciWorld as the reference documents run it: at most 20 turns (AgentGym's
# own scripts give SciWorld 30), and AgentGym's bound on a whole conversation, 4,096 tokens
# (its GenerationConfig(max_length=4096)), not a per-turn budget.
AGENTGYM = "agentgym"
AGENTGYM_MAX_TURNS = 20
AGENTGYM_EPISODE_TOKENS = 4096


@dataclass(frozen=True)
class EvalSampling:
    k: int
    temperature: float
    top_p: float
    max_new_tokens: int
    enable_thinking: bool | None
    # The most tokens one episode's whole conversation may hold (AgentGym); None: unbounded.
    episode_tokens: int | None = None


@dataclass(frozen=True)
class EvalRequest:
    """What `distill eval` was asked; None: the protocol's or the domain's default."""

    model: str  # as the user named it (logged)
    domain: str = "rlve"
    items: int = 200
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    thinking: bool | None = None
    benchmark: str | None = None
    data: str | None = None
    protocol: str | None = None
    workers: int | None = None
    experiment: str | None = None
    # `domain.*` fields given as overrides or a config file's `domain:` section (held-out
    # environments, seeds, sizes); validated like a run's.
    domain_fields: dict[str, Any] = field(default_factory=dict)
    # Sequences per generation batch (eval.batch_size); None: EvalConfig's default.
    batch_size: int | None = None
    # Items whose prompt fills the model's context: fail names them and stops, skip leaves them
    # out and reports them (eval.overlong).
    overlong: Literal["fail", "skip"] = "fail"


@dataclass
class PreparedEval:
    """An eval checked and its items loaded, before any model is resolved or loaded."""

    req: EvalRequest
    episodic: bool
    sampling: EvalSampling
    domain_config: DomainBase
    domain: Domain
    items: list[Item]
    source: str  # where the items came from

    @property
    def bench(self) -> str:
        return self.req.benchmark or self.req.domain


@dataclass
class EvalOutcome:
    result: EvalResult
    benchmark: str  # the name the metrics are logged under
    sampling: EvalSampling
    source: str  # where the items came from
    items: int
    out: Path  # the per-item results file
    mlflow_run_id: str
    parent: str | None  # the training run a checkpoint belongs to
    domain_config: DomainBase
    episodic: bool


def resolve_sampling(
    protocol: str | None,
    benchmark: str | None,
    n: int | None,
    temperature: float | None,
    top_p: float | None,
    max_new_tokens: int | None,
    thinking: bool | None,
) -> EvalSampling:
    """Explicit settings, else the protocol's (`reference` by default with a benchmark), else the
    embedded-default settings (greedy for n=1, 64 new tokens)."""
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unknown --protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    proto = PROTOCOLS[protocol or "reference"] if (protocol or benchmark) else None
    k = n if n is not None else (proto.k if proto else 1)
    if k < 1:
        raise ValueError(f"-n must be >= 1, got {k}")
    if temperature is None:
        temperature = proto.temperature if proto else (0.0 if k == 1 else 0.7)
    return EvalSampling(
        k=k,
        temperature=temperature,
        top_p=top_p if top_p is not None else (proto.top_p if proto else 1.0),
        max_new_tokens=max_new_tokens
        if max_new_tokens is not None
        else (proto.max_new_tokens if proto else 64),
        enable_thinking=thinking if thinking is not None else (proto.enable_thinking if proto else None),
    )


def episodic_sampling(req: EvalRequest) -> EvalSampling:
    """An episodic domain's eval: one greedy episode per item, thinking off; checked options."""
    if req.n not in (None, 1):
        raise ValueError(f"-n: the {req.domain} eval plays one greedy episode per item (-n 1)")
    if req.temperature not in (None, 0.0):
        raise ValueError(f"--temperature: the {req.domain} eval is greedy (0)")
    if req.thinking:
        raise ValueError(f"--thinking: the {req.domain} eval runs with thinking off")
    if req.protocol is not None:
        raise ValueError(f"--protocol sets math sampling; the {req.domain} eval has its own")
    if req.benchmark == AGENTGYM:
        # A turn may write all the episode has left; --max-new-tokens caps each turn below that.
        budget = AGENTGYM_EPISODE_TOKENS
        return EvalSampling(1, 0.0, 1.0, min(req.max_new_tokens or budget, budget), None, budget)
    return EvalSampling(1, 0.0, 1.0, req.max_new_tokens or 64, None)


def check_request(req: EvalRequest, episodic: bool) -> None:
    """Option combinations, checked before any model or data is touched."""
    if req.workers is not None and (not episodic or req.workers < 1):
        raise ValueError(
            "--workers sizes an episodic domain's environment pool (--domain sciworld), and must be >= 1"
        )
    if req.data is not None and req.benchmark is None:
        raise ValueError("--data gives a benchmark's problems: use it with --benchmark")
    if req.benchmark is not None:
        entry = registry.BENCHMARKS.get(req.benchmark)
        known = [name for name, b in registry.BENCHMARKS.items() if b.domain == req.domain]
        if entry is not None and entry.domain != req.domain:
            raise ValueError(
                f"--benchmark {req.benchmark} is a {entry.domain} benchmark: use it with --domain {entry.domain}"
            )
        if entry is None:
            raise ValueError(
                f"unknown --benchmark {req.benchmark!r}; {req.domain}'s: {', '.join(known) or 'none'}"
            )


def training_run(model: str) -> RunDir | None:
    """The run when `model` is one of its checkpoints (runs/<id>/checkpoints/step-N)."""
    path = Path(model).resolve()
    run = RunDir(path.parent.parent)
    if path.parent.name == RunDir.CHECKPOINTS and run.summary.exists():
        return run
    return None


def eval_experiment(model: str, experiment: str | None) -> str:
    """The MLflow experiment an eval is logged to: the one asked for, else the training run's
    of a checkpoint (its eval nests under that run), else "distill"."""
    import yaml

    if experiment:
        return experiment
    parent = training_run(model)
    if parent is not None and parent.config.exists():
        config = yaml.safe_load(parent.config.read_text()) or {}
        return str((config.get("tracking") or {}).get("experiment") or "distill")
    return "distill"


def eval_domain_config(req: EvalRequest, episodic: bool) -> DomainBase:
    """The domain as `distill eval` sees it: the protocol's turn budget, then the user's domain
    fields, then what the options (--benchmark, --data, --workers) say."""
    fields: dict[str, Any] = {"max_turns": AGENTGYM_MAX_TURNS} if episodic else {}
    fields.update(req.domain_fields)
    if req.benchmark is not None and not episodic:
        fields.update(eval_benchmark=req.benchmark, eval_data=req.data)
    if episodic and req.workers is not None:
        fields["pool_size"] = req.workers
    return domain_config(req.domain, **fields)


def prepare_eval(req: EvalRequest) -> PreparedEval:
    """Check the options and load the items: every mistake that needs no model (a bad data file, a
    wrong domain field) is found here, before a zoo build or a model load. The caller closes
    `prepared.domain` (worker processes of graders and simulators)."""
    episodic = registry.domain_entry(req.domain).episodic
    if episodic and req.benchmark is None:
        # An episodic domain's own protocol (SciWorld: AgentGym) is its eval outside a run.
        own = [name for name, b in registry.BENCHMARKS.items() if b.domain == req.domain]
        req = replace(req, benchmark=own[0] if own else None)
    check_request(req, episodic)
    sampling = (
        episodic_sampling(req)
        if episodic
        else resolve_sampling(
            req.protocol, req.benchmark, req.n, req.temperature, req.top_p, req.max_new_tokens, req.thinking
        )
    )
    cfg = eval_domain_config(req, episodic)
    domain = build_domain(cfg)
    try:
        if req.benchmark is not None and episodic:
            items, source = domain.benchmark_items(req.benchmark, req.data, req.items)
        else:
            items = domain.eval_items()[: req.items]
            source = f"{len(items)} items of {req.benchmark or req.domain}"
    except BaseException:
        domain.close()
        raise
    return PreparedEval(req, episodic, sampling, cfg, domain, items, source)


def evaluate_model(
    req: EvalRequest | PreparedEval, path: str, settings: Settings, say: Callable[[str], object] = print
) -> EvalOutcome:
    """Evaluate the model at `path` (the caller resolved `req.model`), write and log the result;
    `say` gets the warnings (a budget capped at the model's context) before the eval starts."""
    prep = req if isinstance(req, PreparedEval) else prepare_eval(req)
    req, sampling, items, bench = prep.req, prep.sampling, prep.items, prep.bench
    try:
        device = place("auto", "student", this_machine())  # the GPU where there is one
        engine = HFEngine.load(path, enable_thinking=sampling.enable_thinking, device=device)
        # A tokenizer without a chat template is refused here, never given a default one.
        apply_chat_template(engine.tokenizer, None, req.model, "--model")
        if not prep.episodic:
            lengths = [len(engine.prompt_ids(item.prompt)) for item in items]
            fit = fit_context(items, lengths, engine.context, req.overlong, f"eval of {req.model} on {bench}")
            if fit.overlong:
                say(
                    f"skipped {len(fit.overlong)} of {len(items)} items whose prompt fills the model's "
                    f"{engine.context} positions (eval.overlong=skip): {named(fit.overlong)}"
                )
            kept = [lengths[i] for i in fit.kept]
            check = check_budget("max_new_tokens", sampling.max_new_tokens, engine.context, kept, "eval")
            if warning := check.warning():
                say(f"warning: {warning}")
        eval_cfg = EvalConfig(
            items=req.items,
            k=sampling.k,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_new_tokens=sampling.max_new_tokens,
            overlong=req.overlong,
            **({"batch_size": req.batch_size} if req.batch_size is not None else {}),
        )
        label = f"eval {req.model} on {bench}"
        if prep.episodic:
            episodic = as_episodic(prep.domain)
            result = evaluate_agent(engine, episodic, items, eval_cfg, label, True, sampling.episode_tokens)
        else:
            result = evaluator_for(prep.domain)(engine, prep.domain, items, eval_cfg, label)
    finally:
        prep.domain.close()  # worker processes (the dapo grader, simulators) stop here
    out = result_file(settings.workspace, req.model, bench, sampling.k)
    result.write(out)
    run_id, parent = _log(req, bench, sampling, len(items), prep.source, result, out, settings)
    return EvalOutcome(
        result,
        bench,
        sampling,
        prep.source,
        len(items),
        out,
        run_id,
        parent,
        prep.domain_config,
        prep.episodic,
    )


def model_label(model: str) -> str:
    """How an eval names the model: a run's checkpoint by run and step (`<run>-step-200`: every
    run's checkpoints are `step-N`), any other model by its folder or hub name."""
    parent = training_run(model)
    name = Path(model).name
    return f"{parent.name}-{name}" if parent is not None else name


def result_file(workspace: Path, model: str, bench: str, k: int) -> Path:
    """The per-item results file of one evaluation: unique to it (time and a random tag)."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return workspace / "evals" / f"{bench}-{model_label(model)}-k{k}-{stamp}-{secrets.token_hex(3)}.jsonl"


def _log(
    req: EvalRequest,
    bench: str,
    sampling: EvalSampling,
    n_items: int,
    source: str,
    result: EvalResult,
    out: Path,
    settings: Settings,
) -> tuple[str, str | None]:
    """A (nested, for a checkpoint) MLflow run with the settings, the metrics and the result file."""
    parent = training_run(req.model)
    tracker = open_tracker(
        parent.tracking_uri(settings) if parent else settings.resolved_tracking_uri,
        eval_experiment(req.model, req.experiment),
        settings.artifact_root,
        run_name=f"eval-{bench}-{model_label(req.model)}",
        parent_run_id=parent.mlflow_run_id() if parent else None,
        tags={"domain": req.domain, "model": req.model, "kind": "eval", "benchmark": bench},
    )
    tracker.log_params(
        {
            "model": req.model,
            "benchmark": bench,
            "data": req.data,
            "item_source": source[:250],
            "protocol": req.protocol or ("reference" if req.benchmark and bench != AGENTGYM else None),
            "k": sampling.k,
            "items": n_items,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_new_tokens": sampling.max_new_tokens,
            "episode_tokens": sampling.episode_tokens,
            "enable_thinking": sampling.enable_thinking,
            "overlong": req.overlong,
            **{f"domain.{key}": value for key, value in req.domain_fields.items()},
        }
    )
    tracker.log_metrics(result.named(bench), step=0)
    # The per-item table (all k verdicts, first responses) travels with the run.
    tracker.log_artifact(out, "eval")
    tracker.finish()
    return tracker.run_id, parent.name if parent else None
