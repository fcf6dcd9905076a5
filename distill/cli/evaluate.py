"""`distill eval`: score one model on a domain's eval set, print it, and log it to MLflow."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 200)


def _training_run(model: str) -> Path | None:
    """The run directory when `model` is one of its checkpoints (runs/<id>/checkpoints/step-N)."""
    path = Path(model).resolve()
    if path.parent.name == "checkpoints" and (path.parent.parent / "summary.json").exists():
        return path.parent.parent
    return None


def run_eval(
    model: str, domain: str, n: int, items: int, temperature: float | None, max_new_tokens: int
) -> None:
    from distill.config import EvalConfig, domain_config
    from distill.domains import build_domain
    from distill.engines.hf import HFEngine
    from distill.evals.runner import evaluate
    from distill.methods.context import eval_metric_names
    from distill.settings import get_settings
    from distill.tracking.mlflow import open_tracker
    from distill.zoo import resolve_model

    settings = get_settings()
    domain_cfg = domain_config(domain)
    path = resolve_model(model, domain_cfg, settings)
    if not model.startswith("zoo:") and Path(model).exists() and not (Path(model) / "config.json").exists():
        raise ValueError(f"{model} is not a model folder (no config.json)")
    engine = HFEngine.load(path)
    dom = build_domain(domain_cfg)
    temp = temperature if temperature is not None else (0.0 if n == 1 else 0.7)
    cfg = EvalConfig(items=items, k=n, temperature=temp, max_new_tokens=max_new_tokens)
    result = evaluate(engine, dom, dom.eval_items()[:items], cfg, label=f"eval {model}")
    table = Table(title=f"{domain} eval of {model} (k={n}, temperature {temp})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.metrics.items():
        table.add_row(key, f"{value:.4f}" if value < 1 or key.endswith(("rate", "@1")) else f"{value:g}")
    console.print(table)
    parent = _training_run(model)
    parent_id = json.loads((parent / "summary.json").read_text()).get("mlflow_run_id") if parent else None
    tracker = open_tracker(
        settings.resolved_tracking_uri,
        "distill",
        settings.artifact_root,
        run_name=f"eval-{Path(model).name}",
        parent_run_id=parent_id,
        tags={"domain": domain, "model": model, "kind": "eval"},
    )
    tracker.log_params({"model": model, "k": n, "items": items, "temperature": temp})
    tracker.log_metrics(eval_metric_names(domain, result), step=0)
    tracker.finish()
    console.print(
        f"logged to MLflow run {tracker.run_id}" + (f" (nested under {parent.name})" if parent else "")
    )
