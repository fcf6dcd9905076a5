"""Playing episodes across the pool: every active episode takes its turn together.

Each turn, the active episodes are grouped by the agent the policy picks for them (student,
teacher, gold script), each agent writes its turns in one batched call, then every parsed action
is sent to its episode's simulator worker at once (the workers step in parallel). A worker that
dies fails its episode with a clear error; the pool restarts it and the next item goes on.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from distill.domains.sciworld.episode import ChatFrame, Episode
from distill.domains.sciworld.prompt import first_observation, format_response

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.domains.base import Item
    from distill.domains.sciworld.pool import EnvPool
    from distill.engines.hf import Completion, HFEngine, KVCache


class Agent(Protocol):
    writer: str

    def act(self, episodes: Sequence[Episode], max_new_tokens: int) -> list[Completion]: ...


class EngineAgent:
    """A model writing turns from the episode's own token sequence."""

    def __init__(
        self,
        engine: HFEngine,
        writer: str,
        temperature: float = 0.0,
        top_p: float = 1.0,
        batch_size: int = 64,
        reuse_cache: bool = True,
    ) -> None:
        self.engine = engine
        self.writer = writer
        self.temperature = temperature
        self.top_p = top_p
        self.batch_size = batch_size
        # Per episode (by uid): the KV cache of its last turn. Only the new observation is
        # prefilled each turn; batching episodes instead re-reads every whole context.
        self.caches: dict[int, KVCache] = {}
        self.reuse_cache = reuse_cache and hasattr(engine, "continue_generate")

    def act(self, episodes: Sequence[Episode], max_new_tokens: int) -> list[Completion]:
        if self.reuse_cache:
            # Episodes leave an agent for good (they end, or ROSE hands them to the teacher).
            live = {ep.uid for ep in episodes}
            self.caches = {uid: c for uid, c in self.caches.items() if uid in live}
            out = []
            for ep in episodes:
                completion, self.caches[ep.uid] = self.engine.continue_generate(
                    ep.ids, self.caches.get(ep.uid), max_new_tokens, self.temperature, self.top_p
                )
                out.append(completion)
            return out
        return self.engine.generate(
            [ep.ids for ep in episodes],
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            batch_size=self.batch_size,
        )


class GoldAgent:
    """Plays the simulator's gold action sequence in the AgentGym format (needs `gold=True`)."""

    def __init__(self, writer: str = "gold", look_before_focus: bool = False) -> None:
        self.writer = writer
        self.look_before_focus = look_before_focus

    def act(self, episodes: Sequence[Episode], max_new_tokens: int) -> list[Completion]:
        from distill.engines.hf import Completion

        out = []
        for ep in episodes:
            gold = ep.gold or []
            if self.look_before_focus:
                gold = look_before_focus(gold)
            action = gold[len(ep.turns)] if len(ep.turns) < len(gold) else "look around"
            text = format_response(action)
            ids: list[int] = []
            if ep.tokenizer is not None:
                ids = list(ep.tokenizer(text, add_special_tokens=False)["input_ids"])
                ids.append(ep.tokenizer.eos_token_id)
            out.append(Completion(ids=ids, text=text, truncated=False))
        return out


def look_before_focus(actions: Sequence[str]) -> list[str]:
    """The gold actions with a "look around" before each "focus on" that directly follows a
    "go to": what the agent focuses on is then named in its context, not guessed."""
    out: list[str] = []
    for action in actions:
        if action.startswith("focus on") and out and out[-1].startswith("go to"):
            out.append("look around")
        out.append(action)
    return out


Policy = Callable[[Episode], Agent]


def single(agent: Agent) -> Policy:
    return lambda ep: agent


def handover(first: Agent, then: Agent, turns: int | Callable[[Episode], int]) -> Policy:
    """`first` writes the first N turns, `then` the rest (ROSE); N fixed or chosen per episode."""

    def pick(ep: Episode) -> Agent:
        n = turns(ep) if callable(turns) else turns
        return first if len(ep.turns) < n else then

    return pick


@dataclass
class PlayConfig:
    max_turns: int = 20
    turn_max_new_tokens: int = 64
    simplification: str = ""
    # Ask the simulator for the gold action sequence on reset (GoldAgent).
    gold: bool = False


def play(
    pool: EnvPool,
    items: Sequence[Item],
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase | None,
    frame: ChatFrame | None,
    config: PlayConfig,
    on_turn: Callable[[Episode], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Episode]:
    """Play one episode per item; episodes come back in item order, failed ones with `error`."""
    queue: deque[tuple[int, Item]] = deque(enumerate(items))
    done: dict[int, Episode] = {}
    active: dict[int, tuple[int, Episode]] = {}  # worker -> (item position, episode)

    def finish(position: int, ep: Episode) -> None:
        done[position] = ep
        if progress is not None:
            progress(1)

    while queue or active:
        starts = []
        for worker in range(pool.size):
            if worker not in active and queue:
                starts.append((worker, *queue.popleft()))
        if starts:
            replies = pool.call_many(
                [
                    (
                        worker,
                        "reset",
                        (
                            item.meta["task_name"],
                            int(item.meta["variation"]),
                            config.simplification,
                            config.gold,
                        ),
                    )
                    for worker, _, item in starts
                ]
            )
            for (worker, position, item), reply in zip(starts, replies, strict=True):
                ep = Episode(item=item, worker=worker, tokenizer=tokenizer, frame=frame)
                if isinstance(reply, Exception):
                    ep.error = f"reset failed: {reply}"
                    finish(position, ep)
                    continue
                ep.gold = reply.get("gold")
                ep.score = int(reply.get("score", 0))
                ep.begin(first_observation(reply["task_description"], reply["observation"]))
                active[worker] = (position, ep)
        if not active:
            continue
        _take_turns(pool, active, policy, config, on_turn, finish)
    return [done[i] for i in range(len(items))]


def _take_turns(
    pool: EnvPool,
    active: dict[int, tuple[int, Episode]],
    policy: Policy,
    config: PlayConfig,
    on_turn: Callable[[Episode], None] | None,
    finish: Callable[[int, Episode], None],
) -> None:
    groups: dict[int, tuple[Agent, list[int]]] = {}
    for worker, (_, ep) in active.items():
        agent = policy(ep)
        groups.setdefault(id(agent), (agent, []))[1].append(worker)
    for agent, workers in groups.values():
        completions = agent.act([active[w][1] for w in workers], config.turn_max_new_tokens)
        if len(completions) != len(workers):
            raise ValueError(
                f"agent {agent.writer} wrote {len(completions)} turns for {len(workers)} episodes"
            )
        for worker, comp in zip(workers, completions, strict=True):
            active[worker][1].add_turn(agent.writer, comp.ids, comp.text, comp.truncated)
    requests: list[tuple[int, str, tuple[Any, ...]]] = []
    for worker, (position, ep) in list(active.items()):
        if on_turn is not None:
            on_turn(ep)
        turn = ep.turns[-1]
        last_turn = len(ep.turns) >= config.max_turns
        if turn.action is None:
            ep.invalid(last=last_turn)
            if last_turn:
                del active[worker]
                finish(position, ep)
            continue
        requests.append((worker, "step", (turn.action,)))
    if not requests:
        return
    start = time.perf_counter()
    replies = pool.call_many(requests)
    seconds = time.perf_counter() - start
    for (worker, _, _), reply in zip(requests, replies, strict=True):
        position, ep = active[worker]
        ep.env_seconds += seconds
        if isinstance(reply, Exception):
            ep.error = f"turn {len(ep.turns)} ({ep.turns[-1].action!r}): {reply}"
            del active[worker]
            finish(position, ep)
            continue
        ep.score = int(reply["score"])
        ep.moves = int(reply["moves"])
        ep.turns[-1].score = ep.score
        ep.done = bool(reply["done"])
        last = ep.done or len(ep.turns) >= config.max_turns
        ep.add_observation(str(reply["observation"]), last=last)
        if last:
            del active[worker]
            finish(position, ep)
