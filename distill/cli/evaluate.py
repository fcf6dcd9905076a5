"""`distill eval`: score one model on a domain's eval set or a benchmark, print it, log it to MLflow.

With `--benchmark` (aime25, hmmt25, aime24; the dapo domain) the problems come from `--data` (a
file or folder in any layout `distill.evals.benchmarks` reads) or the benchmark's hub id, and the
sampling settings default to an eval protocol (`--protocol reference`: the reference documents'
thinking on, temperature 0.7, top_p 0.95, 31,744 new tokens, n=16; `opsd`: n=12, temperature
1.0, 38,912 tokens, thinking off). Flags given explicitly win over the protocol.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from distill.evals.runner import eval_experiment, training_run

if TYPE_CHECKING:
    from distill.evals.runner import EvalResult

console = Console(width=None if sys.stdout.isatty() else 200)


@dataclass(frozen=True)
class Sampling:
    k: int
    temperature: float
    top_p: float
    max_new_tokens: int
    enable_thinking: bool | None


def resolve_sampling(
    protocol: str | None,
    benchmark: str | None,
    n: int | None,
    temperature: float | None,
    top_p: float | None,
    max_new_tokens: int | None,
    thinking: bool | None,
) -> Sampling:
    """Explicit flags, else the protocol's (`reference` by default with a benchmark), else the
    embedded-default settings (greedy for n=1, 64 new tokens)."""
    from distill.evals.benchmarks import PROTOCOLS

    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unknown --protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    proto = PROTOCOLS[protocol or "reference"] if (protocol or benchmark) else None
    k = n if n is not None else (proto.k if proto else 1)
    if k < 1:
        raise ValueError(f"-n must be >= 1, got {k}")
    if temperature is None:
        temperature = proto.temperature if proto else (0.0 if k == 1 else 0.7)
    return Sampling(
        k=k,
        temperature=temperature,
        top_p=top_p if top_p is not None else (proto.top_p if proto else 1.0),
        max_new_tokens=max_new_tokens
        if max_new_tokens is not None
        else (proto.max_new_tokens if proto else 64),
        enable_thinking=thinking if thinking is not None else (proto.enable_thinking if proto else None),
    )


def problem_table(result: EvalResult, title: str) -> Table:
    """One row per problem: reference answer, the first sample's boxed answer, correct of k."""
    from distill.evals.math_grader import extract_boxed

    table = Table(title=title)
    for col, justify in (
        ("problem", "left"),
        ("answer", "left"),
        ("first boxed", "left"),
        ("correct", "right"),
        ("truncated", "right"),
        ("tokens", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in result.rows:
        first = row["responses"][0] if row["responses"] else ""
        boxed = extract_boxed(first)
        table.add_row(
            str(row["id"]),
            str(row["answer"])[:24],
            "-" if boxed is None else boxed[:24],
            f"{row['correct']}/{row['k']}",
            f"{row['truncated']}/{row['k']}",
            f"{row.get('tokens_mean', 0):.0f}",
        )
    return table


def run_eval(
    model: str,
    domain: str,
    n: int | None,
    items: int,
    temperature: float | None,
    max_new_tokens: int | None,
    benchmark: str | None = None,
    data: str | None = None,
    protocol: str | None = None,
    top_p: float | None = None,
    thinking: bool | None = None,
    workers: int | None = None,
    experiment: str | None = None,
) -> None:
    from distill.config import ConfigError, EvalConfig, domain_config
    from distill.domains import build_domain
    from distill.engines.hf import HFEngine
    from distill.evals.runner import evaluate
    from distill.methods.context import eval_metric_names
    from distill.settings import get_settings
    from distill.tracking.mlflow import open_tracker
    from distill.zoo import resolve_model

    if domain == "sciworld":
        # Multi-turn agent episodes on the simulator pool: distill/evals/agent.py.
        from distill.evals.agent import run_agentgym_cli

        run_agentgym_cli(
            model, benchmark, data, items, n, temperature, max_new_tokens, thinking, workers, experiment
        )
        return
    if workers is not None:
        raise ValueError("--workers sizes the simulator pool: use it with --domain sciworld")
    if data is not None and benchmark is None:
        raise ValueError("--data gives a benchmark's problems: use it with --benchmark")
    if benchmark is not None and domain != "dapo":
        raise ValueError(f"--benchmark {benchmark} is a math benchmark: use it with --domain dapo")
    sampling = resolve_sampling(protocol, benchmark, n, temperature, top_p, max_new_tokens, thinking)
    settings = get_settings()
    try:
        fields: dict[str, Any] = {"eval_benchmark": benchmark, "eval_data": data} if benchmark else {}
        domain_cfg = domain_config(domain, **fields)
        # The model is resolved against the plain domain: a zoo build evaluates on its own items.
        path = resolve_model(model, domain_config(domain), settings)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if not model.startswith("zoo:") and Path(model).exists() and not (Path(model) / "config.json").exists():
        raise ValueError(f"{model} is not a model folder (no config.json)")
    dom = build_domain(domain_cfg)
    eval_items = dom.eval_items()[:items]
    engine = HFEngine.load(path, enable_thinking=sampling.enable_thinking)
    cfg = EvalConfig(
        items=items,
        k=sampling.k,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_new_tokens=sampling.max_new_tokens,
    )
    bench = benchmark or domain
    try:
        result = evaluate(engine, dom, eval_items, cfg, label=f"eval {model} on {bench}")
    finally:
        # Domains with worker processes (the dapo grader) stop them here.
        close = getattr(dom, "close", None)
        if close is not None:
            close()
    setting = (
        f"k={sampling.k}, temperature {sampling.temperature}, top_p {sampling.top_p}, "
        f"max_new_tokens {sampling.max_new_tokens}, thinking {sampling.enable_thinking}"
    )
    if benchmark is not None:
        console.print(problem_table(result, f"{bench}: per problem"))
    console.print(f"{bench} eval of {model}: {setting}", soft_wrap=True)
    table = Table(title=f"{bench}: {len(eval_items)} items")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.metrics.items():
        table.add_row(key, f"{value:.4f}" if value < 1 or key.endswith(("rate", "@1")) else f"{value:g}")
    console.print(table)

    out = settings.workspace / "evals" / f"{bench}-{Path(model).name}-k{sampling.k}.jsonl"
    result.write(out)
    parent = training_run(model)
    parent_id = json.loads((parent / "summary.json").read_text()).get("mlflow_run_id") if parent else None
    tracker = open_tracker(
        settings.resolved_tracking_uri,
        eval_experiment(model, experiment),
        settings.artifact_root,
        run_name=f"eval-{bench}-{Path(model).name}",
        parent_run_id=parent_id,
        tags={"domain": domain, "model": model, "kind": "eval", "benchmark": bench},
    )
    tracker.log_params(
        {
            "model": model,
            "benchmark": bench,
            "data": data,
            "protocol": protocol or ("reference" if benchmark else None),
            "k": sampling.k,
            "items": len(eval_items),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_new_tokens": sampling.max_new_tokens,
            "enable_thinking": sampling.enable_thinking,
        }
    )
    tracker.log_metrics(eval_metric_names(bench, result), step=0)
    # The per-problem table (all k verdicts, first responses) travels with the run.
    tracker.log_artifact(out, "eval")
    tracker.finish()
    console.print(
        f"per-problem results in {out}; logged to MLflow run {tracker.run_id}"
        + (f" (nested under {parent.name})" if parent else "")
    )
