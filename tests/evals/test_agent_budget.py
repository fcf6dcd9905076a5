"""The agent eval's episode budget (AgentGym's `max_length`): a whole conversation holds at most
that many tokens, each turn writes up to what is left, and an episode that spent it ends with the
score it has (not failed); `distill eval --benchmark agentgym` uses it instead of a per-turn cap."""

from __future__ import annotations

import pytest

from distill.evals.standalone import (
    AGENTGYM_EPISODE_TOKENS,
    AGENTGYM_MAX_TURNS,
    EvalRequest,
    episodic_sampling,
)

pytestmark = pytest.mark.integration


def test_agentgym_bounds_the_episode_not_the_turn() -> None:
    sampling = episodic_sampling(EvalRequest(model="m", domain="sciworld", benchmark="agentgym"))
    # A turn may write all the episode has left: no 64-token cut before a real model's action.
    assert sampling.episode_tokens == AGENTGYM_EPISODE_TOKENS == 4096
    assert sampling.max_new_tokens == AGENTGYM_EPISODE_TOKENS
    assert AGENTGYM_MAX_TURNS == 20  # the reference documents' protocol
    capped = episodic_sampling(
        EvalRequest(model="m", domain="sciworld", benchmark="agentgym", max_new_tokens=8)
    )
    assert (capped.max_new_tokens, capped.episode_tokens) == (8, AGENTGYM_EPISODE_TOKENS)


def test_an_episode_ends_at_its_token_budget_with_its_score(tiny_zoo, registered) -> None:  # type: ignore[no-untyped-def]
    from episodes.textgame import NAME  # tests/ is on sys.path (rootdir conftest)

    from distill.config import EvalConfig, domain_config
    from distill.config.base import Sampling
    from distill.domains import build_domain
    from distill.engines.hf import HFEngine
    from distill.episodes.episode import frame_for
    from distill.episodes.play import EngineAgent, play, single
    from distill.episodes.protocol import as_episodic
    from distill.evals.agent import EpisodeBudget, evaluate_agent

    engine = HFEngine.load(str(tiny_zoo.student))
    domain = as_episodic(build_domain(domain_config(NAME, eval_size=3, max_turns=20)))
    items = domain.eval_items()  # type: ignore[attr-defined]
    frame = frame_for(engine.tokenizer, engine.enable_thinking)
    free = play(domain, items, single(EngineAgent(engine, "student", Sampling(200))), engine.tokenizer, frame)
    first = [ep.turn_spans()[0] for ep in free]
    # Room for a part of the longest first turn, after the longest prompt.
    budget = max(start for start, _, _ in first) + max(end - start for start, end, _ in first) // 2
    agent = EpisodeBudget(EngineAgent(engine, "student", Sampling(200)), budget)
    episodes = play(domain, items, single(agent), engine.tokenizer, frame, max_tokens=budget)
    for ep in episodes:
        assert not ep.failed, ep.error  # a spent budget ends an episode, it does not fail it
        last_turn_end = ep.turn_spans()[-1][1]
        assert last_turn_end <= budget, (last_turn_end, budget)
        assert ep.done or len(ep.turns) == 20 or len(ep.ids) >= budget
    # A turn that would have run past the budget was cut at what its episode had left.
    cut = [ep for ep in episodes if ep.turns[-1].truncated]
    assert cut and all(ep.turn_spans()[-1][1] == budget for ep in cut)
    # The same bound through the eval: every episode scored, none failed, fewer than 20 turns.
    result = evaluate_agent(
        engine, domain, items, EvalConfig(max_new_tokens=200), show_progress=False, episode_tokens=budget
    )
    assert result.metrics["failed"] == 0 and result.metrics["items"] == 3
    assert all(row["turns"] < 20 for row in result.rows)


def test_distill_eval_passes_the_episode_budget_to_its_episodes(tiny_zoo, registered, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`distill eval` of an episodic domain plays its episodes under the protocol's episode budget
    (here the text game under a tiny one: every episode ends inside it, none failed)."""
    from dataclasses import replace

    from episodes.textgame import NAME

    from distill.evals.standalone import EvalRequest, evaluate_model, prepare_eval
    from distill.settings import Settings

    settings = Settings(workspace=tmp_path / "ws")
    prep = prepare_eval(EvalRequest(model=str(tiny_zoo.student), domain=NAME, items=2, max_new_tokens=200))
    budget = 90
    prep = replace(prep, sampling=replace(prep.sampling, episode_tokens=budget))
    outcome = evaluate_model(prep, str(tiny_zoo.student), settings, say=lambda _: None)
    assert outcome.episodic and outcome.result.metrics["items"] == 2 and outcome.result.metrics["failed"] == 0
    # Each episode ended once it held the budget, well before the game's 6 turns.
    for row in outcome.result.rows:
        assert row["turns"] < 6 and (row["tokens"] >= budget or row["success"]), row
