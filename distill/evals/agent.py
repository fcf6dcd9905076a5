"""Multi-turn agent eval: episodes on the simulator pool, Score / Success / Pass(>0) + per task.

The AgentGym protocol (`distill eval --domain sciworld --benchmark agentgym`): items from the
AgentGym index, either listed in a JSON file of `sciworld_<idx>` ids or a seeded stratified
sample of 200; at most 20 turns, greedy, thinking off. Score is the mean final score / 100, a
final score of -100 counting as 0 unless `negative_score="keep"`; Success is score = 100;
Pass(>0) is score > 0. An episode that failed (its worker died) counts as score 0 and is
listed with its error.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from distill.evals.runner import EvalResult

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.domains.base import Item
    from distill.domains.sciworld import SciWorldDomain
    from distill.domains.sciworld.episode import ChatFrame, Episode
    from distill.engines.hf import HFEngine


@dataclass
class AgentEvalConfig:
    max_turns: int = 20
    turn_max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    batch_size: int = 64
    negative_score: Literal["zero", "keep"] = "zero"


def frame_for(tokenizer: PreTrainedTokenizerBase, enable_thinking: bool | None) -> ChatFrame:
    """The chat frame episodes are played in: thinking off unless the model config says on."""
    from distill.domains.sciworld.episode import ChatFrame

    return ChatFrame.of(tokenizer, False if enable_thinking is None else enable_thinking)


def summarize_episodes(
    episodes: list[Episode], negative_score: str = "zero", seconds: float | None = None
) -> dict[str, float]:
    """Episodes -> the `eval/<benchmark>/` vocabulary, plus `task/<id>/...` per task type."""
    from distill.domains.sciworld.episode import reward_of

    if not episodes:
        raise ValueError("summarize_episodes: no episodes")
    n = len(episodes)
    rewards = [0.0 if ep.failed else reward_of(ep.score, negative_score) for ep in episodes]
    scores = [0 if ep.failed else ep.score for ep in episodes]
    turns = [t for ep in episodes for t in ep.turns]
    metrics: dict[str, float] = {
        "score": sum(rewards) / n,
        "success": sum(s >= 100 for s in scores) / n,
        "pass_gt0": sum(s > 0 for s in scores) / n,
        "items": float(n),
        "failed": float(sum(ep.failed for ep in episodes)),
        "turns_mean": sum(len(ep.turns) for ep in episodes) / n,
        "invalid_action_rate": sum(not t.valid for t in turns) / max(len(turns), 1),
        "truncation_rate": sum(t.truncated for t in turns) / max(len(turns), 1),
        "response_tokens_mean": sum(t.tokens for t in turns) / max(len(turns), 1),
        "env_step_time_s": sum(ep.env_seconds for ep in episodes) / max(len(turns), 1),
    }
    if seconds:
        metrics["episodes_per_min"] = 60.0 * n / seconds
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, ep in enumerate(episodes):
        by_task[str(ep.item.meta.get("task_id"))].append(i)
    for task, idx in by_task.items():
        metrics[f"task/{task}/score"] = sum(rewards[i] for i in idx) / len(idx)
        metrics[f"task/{task}/success"] = sum(scores[i] >= 100 for i in idx) / len(idx)
        metrics[f"task/{task}/pass_gt0"] = sum(scores[i] > 0 for i in idx) / len(idx)
        metrics[f"task/{task}/items"] = float(len(idx))
    return metrics


def evaluate_agent(
    engine: HFEngine,
    domain: SciWorldDomain,
    items: list[Item],
    config: AgentEvalConfig,
    label: str = "eval",
    show_progress: bool = True,
) -> EvalResult:
    """Play one greedy (by default) episode per item across the domain's pool and summarise."""
    from distill.domains.sciworld.play import EngineAgent, PlayConfig, play, single
    from distill.progress import progress_bar

    agent = EngineAgent(engine, "student", config.temperature, config.top_p, config.batch_size)
    frame = frame_for(engine.tokenizer, engine.enable_thinking)
    play_cfg = PlayConfig(max_turns=config.max_turns, turn_max_new_tokens=config.turn_max_new_tokens)
    start = time.perf_counter()
    with progress_bar(label, total=len(items), enabled=show_progress) as advance:
        episodes = play(
            domain.pool(), items, single(agent), engine.tokenizer, frame, play_cfg, progress=advance
        )
    seconds = time.perf_counter() - start
    metrics = summarize_episodes(episodes, config.negative_score, seconds)
    rows = []
    for ep in episodes:
        row = ep.record(config.negative_score)
        row["responses"] = [t.response for t in ep.turns[:3]]
        rows.append(row)
    return EvalResult(metrics=metrics, rows=rows)


def agentgym_items(
    domain: SciWorldDomain, data: Path | None, n: int = 200, seed: int = 0
) -> tuple[list[Item], str]:
    """The items to evaluate and a sentence saying where they came from."""
    from distill.domains.sciworld import item_of
    from distill.domains.sciworld.index import read_item_list, stratified_sample

    index = domain.agentgym_index()
    if data is not None:
        entries = read_item_list(data, index)
        return [item_of(e) for e in entries], f"{len(entries)} items listed in {data}"
    entries = stratified_sample(index, n, seed)
    tasks = len({e.task_id for e in entries})
    source = (
        f"no item list given (--data): a stratified sample of {len(entries)} items over {tasks} task types "
        f"of the {len(index)}-item AgentGym index, seed {seed}"
    )
    return [item_of(e) for e in entries], source


def run_agentgym_eval(
    model: str,
    data: Path | None = None,
    items: int = 200,
    seed: int = 0,
    workers: int | None = None,
    max_turns: int = 20,
    turn_max_new_tokens: int | None = None,
    negative_score: Literal["zero", "keep"] = "zero",
    log: bool = True,
    experiment: str | None = None,
) -> EvalResult:
    """`distill eval --domain sciworld --benchmark agentgym`: print the table, log to MLflow."""
    from rich.console import Console
    from rich.table import Table

    from distill.config import domain_config
    from distill.domains import build_domain
    from distill.engines.hf import HFEngine
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    console = Console()
    settings = get_settings()
    fields: dict[str, Any] = {"negative_score": negative_score, "max_turns": max_turns}
    if workers is not None:
        fields["pool_size"] = workers
    cfg = domain_config("sciworld", **fields)
    engine = HFEngine.load(resolve_model(model, cfg, settings))
    domain: SciWorldDomain = build_domain(cfg)  # type: ignore[assignment]
    try:
        chosen, source = agentgym_items(domain, data, items, seed)
        console.print(f"agentgym: {source}")
        eval_cfg = AgentEvalConfig(
            max_turns=max_turns,
            turn_max_new_tokens=turn_max_new_tokens or cfg.turn_max_new_tokens,  # type: ignore[union-attr]
            negative_score=negative_score,
        )
        result = evaluate_agent(engine, domain, chosen, eval_cfg, label=f"agentgym {model}")
    finally:
        domain.close()
    m = result.metrics
    table = Table(title=f"sciworld agentgym eval of {model} (≤{max_turns} turns, greedy, thinking off)")
    for col in ("task", "items", "Score", "Success", "Pass(>0)"):
        table.add_column(col, justify="right" if col != "task" else "left")
    tasks = sorted({k.split("/")[1] for k in m if k.startswith("task/")}, key=_task_order)
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
    console.print(table)
    console.print(
        f"score: mean final score / 100 (-100 counted as {'0' if negative_score == 'zero' else '-1'}); "
        f"failed episodes: {m['failed']:g}; turns/episode {m['turns_mean']:.1f}; "
        f"invalid actions {m['invalid_action_rate']:.1%}; "
        f"{m.get('episodes_per_min', 0):.1f} episodes/min with {cfg.pool_size} workers"  # type: ignore[union-attr]
    )
    if log:
        from distill.evals.runner import eval_experiment
        from distill.tracking.mlflow import open_tracker

        tracker = open_tracker(
            settings.resolved_tracking_uri,
            eval_experiment(model, experiment),
            settings.artifact_root,
            run_name=f"eval-agentgym-{Path(model).name}",
            tags={"domain": "sciworld", "model": model, "kind": "eval", "benchmark": "agentgym"},
        )
        tracker.log_params(
            {"model": model, "items": len(chosen), "item_source": source[:250], "max_turns": max_turns}
        )
        tracker.log_metrics({f"eval/agentgym/{k}": v for k, v in m.items()}, step=0)
        out = settings.workspace / "eval" / f"agentgym-{Path(model).name}-{tracker.run_id[:8]}.jsonl"
        result.write(out)
        tracker.log_artifact(out)
        tracker.finish()
        console.print(f"logged to MLflow run {tracker.run_id}; episodes in {out}")
    return result


def _task_order(task: str) -> tuple[int, int]:
    major, _, minor = task.partition("-")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else (999, 0)


def run_agentgym_cli(
    model: str,
    benchmark: str | None,
    data: str | None,
    items: int,
    n: int | None,
    temperature: float | None,
    max_new_tokens: int | None,
    thinking: bool | None,
    workers: int | None = None,
    experiment: str | None = None,
) -> EvalResult:
    """The `distill eval --domain sciworld` entry: the AgentGym protocol, checked options."""
    if benchmark not in (None, "agentgym"):
        raise ValueError(f"--benchmark {benchmark}: the sciworld domain has one benchmark, agentgym")
    if n not in (None, 1):
        raise ValueError("-n: the agentgym protocol plays one greedy episode per item (-n 1)")
    if temperature not in (None, 0.0):
        raise ValueError("--temperature: the agentgym protocol is greedy (0)")
    if thinking:
        raise ValueError("--thinking: the agentgym protocol runs with thinking off")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    return run_agentgym_eval(
        model,
        data=Path(data) if data else None,
        items=items,
        workers=workers,
        turn_max_new_tokens=max_new_tokens,
        experiment=experiment,
    )


def evaluate_in_run(
    engine: HFEngine, domain: SciWorldDomain, items: list[Item], config: Any, label: str = "eval"
) -> EvalResult:
    """What a run's eval (runner.py's `evaluate`) calls for a multi-turn domain.

    `config` is the run's EvalConfig: greedy when its temperature is 0; the episode limits come
    from the domain config.
    """
    dcfg = domain.config
    cfg = AgentEvalConfig(
        max_turns=dcfg.max_turns,
        turn_max_new_tokens=dcfg.turn_max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        batch_size=config.batch_size,
        negative_score=dcfg.negative_score,
    )
    return evaluate_agent(engine, domain, items, cfg, label=label)
