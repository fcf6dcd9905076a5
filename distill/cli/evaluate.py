"""`distill eval`: resolve the model, call `distill.evals.standalone`, print the tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.table import Table

    from distill.evals.single_turn import EvalResult
    from distill.evals.standalone import EvalOutcome, EvalRequest


def eval_command(req: EvalRequest) -> EvalOutcome:
    """Evaluate and print; raises ValueError / OSError with a one-line message on bad input.

    Cheap checks first: the model's name (a folder with a model and a tokenizer, a zoo name, a
    cached or reachable hub id), then the options and the items; only then a zoo build or a load.
    """
    from distill.config import ConfigError, domain_config
    from distill.evals.standalone import evaluate_model, prepare_eval
    from distill.settings import get_settings
    from distill.zoo import resolve_model
    from distill.zoo.check import check_model_name

    settings = get_settings()
    try:
        check_model_name(req.model, req.domain, "--model")
        prepared = prepare_eval(req)
        try:
            # The model is resolved against the plain domain: a zoo build evaluates on its own items.
            path = resolve_model(req.model, domain_config(req.domain), settings)
        except BaseException:
            prepared.domain.close()
            raise
        outcome = evaluate_model(prepared, path, settings, say=lambda line: typer.echo(line, err=True))
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if outcome.episodic:
        print_episodes(outcome, req.model)
    else:
        print_responses(outcome, req.model)
    return outcome


def print_responses(outcome: EvalOutcome, model: str) -> None:
    from rich.table import Table

    from distill.cli.common import console

    out = console()
    s, bench = outcome.sampling, outcome.benchmark
    if bench != outcome.domain_config.name:
        out.print(problem_table(outcome.result, f"{bench}: per problem"))
    setting = (
        f"k={s.k}, temperature {s.temperature}, top_p {s.top_p}, max_new_tokens {s.max_new_tokens}, "
        f"thinking {s.enable_thinking}"
    )
    out.print(f"{bench} eval of {model}: {setting}", soft_wrap=True)
    table = Table(title=f"{bench}: {outcome.items} items")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in outcome.result.metrics.items():
        table.add_row(key, f"{value:.4f}" if value < 1 or key.endswith(("rate", "@1")) else f"{value:g}")
    out.print(table)
    _logged(outcome)


def print_episodes(outcome: EvalOutcome, model: str) -> None:
    """Score / Success / Pass(>0) per task type and in all, then how the episodes went."""
    from rich.table import Table

    from distill.cli.common import console
    from distill.evals.agent import task_order

    out = console()
    out.print(f"{outcome.benchmark}: {outcome.source}")
    m = outcome.result.metrics
    turns = getattr(outcome.domain_config, "max_turns", "?")
    budget = outcome.sampling.episode_tokens
    tokens = f"≤{budget} tokens an episode" if budget else f"≤{outcome.sampling.max_new_tokens} tokens a turn"
    table = Table(
        title=f"{outcome.domain_config.name} {outcome.benchmark} eval of {model} "
        f"(≤{turns} turns, {tokens}, greedy, thinking off)"
    )
    for col in ("task", "items", "Score", "Success", "Pass(>0)"):
        table.add_column(col, justify="right" if col != "task" else "left")
    tasks = sorted({k.split("/")[1] for k in m if k.startswith("task/")}, key=task_order)
    for task in tasks:
        table.add_row(
            task,
            f"{m[f'task/{task}/items']:g}",
            f"{m[f'task/{task}/score']:.4f}",
            f"{m[f'task/{task}/success']:.4f}",
            f"{m[f'task/{task}/pass_gt0']:.4f}",
        )
    table.add_row(
        "all", f"{m['items']:g}", f"{m['score']:.4f}", f"{m['success']:.4f}", f"{m['pass_gt0']:.4f}"
    )
    out.print(table)
    workers = getattr(outcome.domain_config, "pool_size", "?")
    out.print(
        f"score: mean reward of the final scores; failed episodes: {m['failed']:g}; turns/episode "
        f"{m['turns_mean']:.1f}; invalid actions {m['invalid_action_rate']:.1%}; "
        f"{m.get('episodes_per_min', 0):.1f} episodes/min with {workers} workers"
    )
    _logged(outcome)


def _logged(outcome: EvalOutcome) -> None:
    from distill.cli.common import console

    console().print(
        f"per-item results in {outcome.out}; logged to MLflow run {outcome.mlflow_run_id}"
        + (f" (nested under {outcome.parent})" if outcome.parent else "")
    )


def problem_table(result: EvalResult, title: str) -> Table:
    """One row per problem: reference answer, the first sample's boxed answer, correct of k."""
    from rich.table import Table

    from distill.domains.dapo.grader import final_answer

    table = Table(title=title)
    for col, justify in (
        ("problem", "left"),
        ("answer", "left"),
        ("final answer", "left"),
        ("correct", "right"),
        ("truncated", "right"),
        ("tokens", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]  # rich's Literal of justify names
    for row in result.rows:
        first = row["responses"][0] if row["responses"] else ""
        boxed = final_answer(first)
        table.add_row(
            str(row["id"]),
            str(row["answer"])[:24],
            "-" if boxed is None else boxed[:24],
            f"{row['correct']}/{row['k']}",
            f"{row['truncated']}/{row['k']}",
            f"{row.get('tokens_mean', 0):.0f}",
        )
    return table
