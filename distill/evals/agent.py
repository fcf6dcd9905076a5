"""Multi-turn agent eval on any episodic domain: Score / Success / Pass(>0), and per task.

One episode per item, played to the domain's turn budget with the eval's sampling (greedy by
default) and `eval.max_new_tokens` per turn; with an episode budget (`episode_tokens`: AgentGym's
4,096 tokens for a whole conversation) each turn gets at most what the episode has left, and the
episode ends, with the score it has, once its conversation holds that many tokens. Score is the mean reward of the final scores
(`EpisodicDomain.reward`: SciWorld's score / 100, -100 counting as 0 unless
`negative_score="keep"`); Success is a solved task; Pass(>0) is a score above 0. An episode that
failed (its environment died) counts as score 0 and is listed with its error. The AgentGym
protocol on SciWorld (`distill eval --domain sciworld --benchmark agentgym`) is this eval on the
AgentGym items (distill/domains/sciworld/index.py).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from distill.engines.base import Completion
from distill.episodes.episode import frame_for
from distill.episodes.play import EngineAgent, play, single
from distill.episodes.protocol import as_episodic
from distill.evals.single_turn import EvalResult
from distill.progress import progress_bar

if TYPE_CHECKING:
    from distill.config import EvalConfig
    from distill.domains.base import Domain, Item
    from distill.engines.base import Engine
    from distill.episodes.episode import Episode
    from distill.episodes.protocol import EpisodicDomain


def summarize_episodes(
    episodes: list[Episode], domain: EpisodicDomain, seconds: float | None = None
) -> dict[str, float]:
    """Episodes -> the `eval/<benchmark>/` vocabulary, plus `task/<id>/...` per task type."""
    if not episodes:
        raise ValueError("summarize_episodes: no episodes")
    n = len(episodes)
    rewards = [0.0 if ep.failed else domain.reward(ep.score) for ep in episodes]
    scores = [0 if ep.failed else ep.score for ep in episodes]
    turns = [t for ep in episodes for t in ep.turns]
    metrics: dict[str, float] = {
        "score": sum(rewards) / n,
        "success": sum(domain.solved(s) for s in scores) / n,
        "pass_gt0": sum(s > 0 for s in scores) / n,
        "items": float(n),
        "failed": float(sum(ep.failed for ep in episodes)),
        "turns_mean": sum(len(ep.turns) for ep in episodes) / n,
        "invalid_action_rate": sum(not t.valid for t in turns) / max(len(turns), 1),
        "truncation_rate": sum(t.truncated for t in turns) / max(len(turns), 1),
        # Turns that ran on past their action and were ended there (the domain's turn_end).
        "stopped_rate": sum(t.stopped for t in turns) / max(len(turns), 1),
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
        metrics[f"task/{task}/success"] = sum(domain.solved(scores[i]) for i in idx) / len(idx)
        metrics[f"task/{task}/pass_gt0"] = sum(scores[i] > 0 for i in idx) / len(idx)
        metrics[f"task/{task}/items"] = float(len(idx))
    return metrics


class EpisodeBudget:
    """An agent whose episodes share one token budget each (AgentGym's `max_length`): a turn gets
    at most what its episode has left (and at most the sampling's own per-turn cap). The turns of
    a batch are drawn with the largest budget among them and each is cut to its own; greedy turns
    equal those drawn with their own budget, and a cut turn spends its episode, which then ends
    (`play(max_tokens=...)`)."""

    def __init__(self, agent: EngineAgent, tokens: int) -> None:
        self.agent, self.tokens, self.writer = agent, tokens, agent.writer
        self.per_turn = agent.sampling

    def act(self, episodes: Sequence[Episode]) -> list[Completion]:
        left = [max(1, self.tokens - len(ep.ids)) for ep in episodes]
        cap = min(self.per_turn.max_new_tokens, max(left, default=1))
        self.agent.sampling = replace(self.per_turn, max_new_tokens=cap)
        out = self.agent.act(episodes)
        return [self._cut(c, n) for c, n in zip(out, left, strict=True)]

    def _cut(self, comp: Completion, budget: int) -> Completion:
        if len(comp.ids) <= budget:
            return comp
        ids = comp.ids[:budget]
        text = str(self.agent.engine.tokenizer.decode(ids, skip_special_tokens=True))
        return Completion(ids=ids, text=text, truncated=True)


def evaluate_agent(
    engine: Engine,
    domain: EpisodicDomain,
    items: list[Item],
    config: EvalConfig,
    label: str = "eval",
    show_progress: bool = True,
    episode_tokens: int | None = None,
) -> EvalResult:
    """Play one episode per item (greedy at temperature 0) across the domain's envs and summarise;
    `episode_tokens`: the most tokens one episode's conversation may hold (None: no bound but the
    model's context and each turn's `max_new_tokens`)."""
    agent = EngineAgent(engine, "student", config.sampling(), config.batch_size)
    writer = agent if episode_tokens is None else EpisodeBudget(agent, episode_tokens)
    frame = frame_for(engine.tokenizer, engine.enable_thinking)
    start = time.perf_counter()
    with progress_bar(label, total=len(items), enabled=show_progress) as advance:
        episodes = play(
            domain,
            items,
            single(writer),
            engine.tokenizer,
            frame,
            progress=advance,
            max_tokens=episode_tokens,
        )
    seconds = time.perf_counter() - start
    metrics = summarize_episodes(episodes, domain, seconds)
    rows = []
    for ep in episodes:
        row = ep.record(domain)
        row["responses"] = [t.response for t in ep.turns[:3]]
        rows.append(row)
    return EvalResult(metrics=metrics, rows=rows)


def evaluate_episodes(
    engine: Engine,
    domain: Domain,
    items: list[Item],
    config: EvalConfig,
    label: str = "eval",
    show_progress: bool = True,
) -> EvalResult:
    """A run's eval on an episodic domain (the same call as the single-turn `evaluate`)."""
    return evaluate_agent(engine, as_episodic(domain), items, config, label, show_progress)


def task_order(task: str) -> tuple[int, int]:
    """Tasks named `major-minor` (SciWorld's `4-2`) in numeric order; others last."""
    major, _, minor = task.partition("-")
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else (999, 0)
