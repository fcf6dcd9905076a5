"""Multi-turn play speed on SciWorld: concurrent episodes' turns batched (each episode from its own
KV cache, engines/batched.py) against decoding them one episode at a time, as distill did before.
Batched play runs twice: with its lean decode step (engines/decode.py, the default) and with
every step through the transformers model call (`HFEngine.lean_decode = False`).

The AgentGym eval path (`distill eval --domain sciworld --benchmark agentgym --workers N`): real
ScienceWorld JVMs, N episodes in flight, greedy turns of up to `eval.max_new_tokens` tokens, at
most 20 turns. The ways take turns in blocks of items over the same pool in this process (each
round in a rotated order), each block a fresh stratified sample; the table reports episodes/min
and turns/s per side (medians over blocks), and the ratios to one-by-one.

    python benchmarks/episode_play.py --model zoo:student --workers 4 --items 24 --blocks 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

from distill.config import Sampling


def one_by_one_agent(engine: Any, max_new_tokens: int) -> Any:
    """The previous EngineAgent.act: each episode's turn decoded alone from its cache."""
    from distill.episodes.play import EngineAgent

    class OneByOne(EngineAgent):
        def act(self, episodes: Sequence[Any]) -> list[Any]:
            out = []
            for ep in episodes:
                completion, self.caches[ep.uid] = self.engine.continue_generate(
                    ep.ids, self.caches.get(ep.uid), self.sampling
                )
                out.append(completion)
            return out

    return OneByOne(engine, "student", Sampling(max_new_tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="zoo:student")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--items", type=int, default=24, help="episodes per block")
    parser.add_argument("--blocks", type=int, default=4, help="blocks per side")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("JAVA_TOOL_OPTIONS", "-Xmx1g")
    import torch

    from distill.config import domain_config
    from distill.domains import build_domain
    from distill.engines.hf import HFEngine
    from distill.episodes.episode import frame_for
    from distill.episodes.play import EngineAgent, play, single
    from distill.episodes.protocol import as_episodic
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    torch.set_num_threads(args.threads)
    config = domain_config("sciworld", pool_size=args.workers, max_turns=20)
    engine = HFEngine.load(resolve_model(args.model, config, get_settings()))
    domain = as_episodic(build_domain(config))
    items, _ = domain.benchmark_items("agentgym", None, args.items * args.blocks * 3)  # type: ignore[attr-defined]
    # side -> (agent, lean decode step)
    sides = {
        "batched": (lambda: EngineAgent(engine, "student", Sampling(args.max_new_tokens)), True),
        "batched, transformers step": (
            lambda: EngineAgent(engine, "student", Sampling(args.max_new_tokens)),
            False,
        ),
        "one by one": (lambda: one_by_one_agent(engine, args.max_new_tokens), True),
    }
    frame = frame_for(engine.tokenizer, engine.enable_thinking)
    rates: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    names = list(sides)
    try:
        play(domain, items[:2], single(sides["batched"][0]()), engine.tokenizer, frame)  # JVMs up, warm
        block = 0
        for round_ in range(args.blocks):
            for side in names[round_ % 3 :] + names[: round_ % 3]:
                agent, engine.lean_decode = sides[side][0](), sides[side][1]
                chunk = items[block * args.items : (block + 1) * args.items]
                block += 1
                start = time.perf_counter()
                episodes = play(domain, chunk, single(agent), engine.tokenizer, frame)
                seconds = time.perf_counter() - start
                turns = sum(len(ep.turns) for ep in episodes)
                rates[side].append((60 * len(episodes) / seconds, turns / seconds))
                print(f"block {block}: {side}: {rates[side][-1][0]:.1f} episodes/min", flush=True)
    finally:
        domain.close()
    print(
        f"\nSciWorld AgentGym items, {args.model}, {args.workers} workers, greedy, <= {args.max_new_tokens} "
        f"tokens/turn, <= 20 turns, {args.threads} thread(s); {args.blocks} blocks of {args.items} episodes "
        "per side, rotating\n\n| | episodes/min (median) | turns/s (median) | vs one by one |\n|---|---|---|---|"
    )
    base = statistics.median(v[0] for v in rates["one by one"])
    for side, values in rates.items():
        rate = statistics.median(v[0] for v in values)
        print(f"| {side} | {rate:.1f} | {statistics.median(v[1] for v in values):.2f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
