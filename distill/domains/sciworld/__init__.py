"""SciWorld: multi-turn agent episodes on the real ScienceWorld simulator (`scienceworld`).

Items are (task, variation) pairs named by their AgentGym index (`sciworld_<idx>`); training
items come from the simulator's train variations of `domain.tasks`, eval items from its test
variations. An item's `solution` is its gold trajectory in the AgentGym format (the simulator's
gold action sequence played through the simulator, observations included), materialised once
in the workspace: it is what the embedded teacher is trained on and what the tokenizer covers.

The domain implements the episodic protocol (`distill/episodes/protocol.py`): episodes are
played with `distill.episodes.play` across an `EnvPool` (one JVM per worker process).
"""

from __future__ import annotations

import json
import random
from functools import cached_property
from typing import TYPE_CHECKING, Any

from distill.domains.base import Domain, Item, Score, cached_items
from distill.domains.sciworld.index import (
    IndexEntry,
    build_index,
    read_item_list,
    stratified_sample,
    task_name,
    task_table,
)
from distill.domains.sciworld.pool import EnvPool
from distill.domains.sciworld.prompt import (
    FIRST_REPLY,
    INSTRUCTION,
    INVALID_ACTION,
    action_end,
    first_observation,
    format_response,
    parse_action,
    refused,
)
from distill.episodes.play import ScriptedAgent, play, single
from distill.episodes.protocol import EnvReply, Script

if TYPE_CHECKING:
    from collections.abc import Sequence

    from distill.domains.sciworld.config import SciWorldDomainConfig
    from distill.domains.sciworld.pool import EnvPool
    from distill.episodes.episode import Episode
    from distill.episodes.protocol import Task


# The AgentGym conversation around the observations.
AGENTGYM = Script(instruction=INSTRUCTION, first_reply=FIRST_REPLY, invalid_feedback=INVALID_ACTION)


class SciWorldEnvs:
    """The worker pool as the episodic protocol's environment slots (slot = worker).

    An episode ends at the simulator's move limit (`env_step_limit`, ScienceWorldEnv's
    `envStepLimit`), except a replay of the simulator's own gold sequence (a reset that asked
    for it): ScienceWorldEnv only flags `done` past the limit and goes on stepping, so its own
    replay of a long gold path (178 actions on 9-3) reaches the final score; ours must too.
    """

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool
        self.replays: set[int] = set()

    @property
    def size(self) -> int:
        return self.pool.size

    def reset_many(self, requests: Sequence[tuple[int, Task, bool]]) -> list[EnvReply | Exception]:
        replies = self.pool.call_many(
            [
                (slot, "reset", (task.meta["task_name"], int(task.meta["variation"]), "", gold))
                for slot, task, gold in requests
            ]
        )
        for slot, _, gold in requests:
            if gold:
                self.replays.add(slot)
            else:
                self.replays.discard(slot)
        out: list[EnvReply | Exception] = []
        for reply in replies:
            if isinstance(reply, Exception):
                out.append(reply)
                continue
            first = first_observation(reply["task_description"], reply["observation"])
            out.append(EnvReply(first, score=int(reply.get("score", 0)), gold=reply.get("gold")))
        return out

    def step_many(self, requests: Sequence[tuple[int, str]]) -> list[EnvReply | Exception]:
        replies = self.pool.call_many([(slot, "step", (action,)) for slot, action in requests])
        out: list[EnvReply | Exception] = []
        for (slot, _), reply in zip(requests, replies, strict=True):
            if isinstance(reply, Exception):
                out.append(reply)
                continue
            observation = str(reply["observation"])
            out.append(
                EnvReply(
                    observation,
                    score=int(reply["score"]),
                    done=bool(reply["completed"] if slot in self.replays else reply["done"]),
                    moves=int(reply["moves"]),
                    valid=not refused(observation),
                )
            )
        return out


def item_of(entry: IndexEntry) -> Item:
    return Item(
        id=entry.item_id,
        prompt="",
        answer="",
        meta={
            "index": entry.index,
            "task_id": entry.task_id,
            "task_name": entry.task_name,
            "variation": entry.variation,
        },
    )


class SciWorldDomain(Domain):
    """ScienceWorld as an episodic domain (`distill.episodes.protocol.EpisodicDomain`)."""

    name = "sciworld"
    script = AGENTGYM

    def __init__(self, config: SciWorldDomainConfig, pool: EnvPool | None = None) -> None:
        if not config.tasks:
            raise ValueError("domain.tasks: give at least one ScienceWorld task id (e.g. 4-2)")
        for task in config.tasks:
            try:
                task_name(task)
            except ValueError as exc:
                raise ValueError(f"domain.tasks: {exc}") from None
        self.config = config
        # A pool handed in is borrowed: close() leaves it running for its owner.
        self._pool: EnvPool | None = pool
        self._owns_pool = pool is None

    # -- simulators ----------------------------------------------------------------------
    def pool(self) -> EnvPool:
        """The domain's worker pool, started on first use and reused (close() stops it)."""
        if self._pool is None:
            cfg = self.config
            self._pool = EnvPool(cfg.pool_size, cfg.java_heap, cfg.env_step_limit, cfg.step_timeout_s)
            self._owns_pool = True
        return self._pool

    def close(self) -> None:
        if self._pool is not None and self._owns_pool:
            self._pool.close()
            self._pool = None

    # -- the episodic protocol -------------------------------------------------------------
    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    def envs(self) -> SciWorldEnvs:
        return SciWorldEnvs(self.pool())

    def parse_action(self, response: str) -> str | None:
        return parse_action(response)

    def action_text(self, action: str) -> str:
        return format_response(action)

    def turn_end(self, response: str) -> int | None:
        return action_end(response) if self.config.stop_at_action else None

    def reward(self, score: int) -> float:
        """Final score / 100; a negative score (irreversible failure) is 0 unless `keep`."""
        if score < 0 and self.config.negative_score == "zero":
            return 0.0
        return score / 100.0

    def solved(self, score: int) -> bool:
        return score >= 100

    @cached_property
    def _simulator_facts(self) -> dict[str, Any]:
        """Variation counts of every task and the train/test splits of `domain.tasks`."""

        def make() -> list[Item]:
            pool = self.pool()
            names = list(task_table().values())
            counts = pool.call(0, "max_variations", names)
            splits = {task: pool.call(0, "splits", task_name(task)) for task in self.config.tasks}
            return [Item(id="facts", prompt="", answer="", meta={"counts": counts, "splits": splits})]

        facts_config = self.config.model_copy(update={"train_size": 1, "eval_size": 1})
        return cached_items(facts_config, "simulator", make)[0].meta

    def agentgym_index(self) -> list[IndexEntry]:
        return build_index(self._simulator_facts["counts"])

    def benchmark_items(
        self, name: str, data: str | None, count: int, seed: int = 0
    ) -> tuple[list[Item], str]:
        """AgentGym's items: those listed in `data` (a JSON file of `sciworld_<idx>` ids), else a
        seeded stratified sample of `count` over the task types of the AgentGym index."""
        from pathlib import Path

        if name != "agentgym":
            raise ValueError(f"--benchmark {name}: the sciworld domain has one benchmark, agentgym")
        index = self.agentgym_index()
        if data is not None:
            entries = read_item_list(Path(data), index)
            return [item_of(e) for e in entries], f"{len(entries)} items listed in {data}"
        entries = stratified_sample(index, count, seed)
        tasks = len({e.task_id for e in entries})
        source = (
            f"no item list given (--data): a stratified sample of {len(entries)} items over {tasks} task "
            f"types of the {len(index)}-item AgentGym index, seed {seed}"
        )
        return [item_of(e) for e in entries], source

    def _entries(self, splits: tuple[str, ...], count: int, seed: int) -> list[IndexEntry]:
        index = self.agentgym_index()
        by_key = {(e.task_id, e.variation): e for e in index}
        per_task = []
        for task in self.config.tasks:
            variations = [v for split in splits for v in self._simulator_facts["splits"][task][split]]
            entries = [by_key[(task, v)] for v in variations if (task, v) in by_key]
            random.Random(f"{seed}-{task}").shuffle(entries)
            per_task.append(entries)
        # Interleave the tasks so any prefix of the list covers all of them.
        out: list[IndexEntry] = []
        while len(out) < count and any(per_task):
            for entries in per_task:
                if entries and len(out) < count:
                    out.append(entries.pop())
        return out

    # -- items ---------------------------------------------------------------------------
    @cached_property
    def _train(self) -> list[Item]:
        return cached_items(
            self.config,
            "train",
            lambda: self.with_gold(
                [item_of(e) for e in self._entries(self._train_splits, self.config.train_size, 0)]
            ),
        )

    @cached_property
    def _eval(self) -> list[Item]:
        return cached_items(
            self.config,
            "eval",
            # Eval items need no gold play: the model plays them.
            lambda: [
                item_of(e) for e in self._entries(("test",), self.config.eval_size, self.config.eval_seed)
            ],
        )

    @property
    def _train_splits(self) -> tuple[str, ...]:
        return ("train", "dev") if self.config.train_on_dev else ("train",)

    def train_items(self) -> list[Item]:
        return self._train

    def eval_items(self) -> list[Item]:
        return self._eval

    def with_gold(self, items: list[Item]) -> list[Item]:
        """Items with their gold trajectory (played through the simulator) as `solution`."""
        script = look_before_focus if self.config.gold_look else None
        # Text only (tokenizer None): no model reads these episodes.
        agent = ScriptedAgent(format_response, script=script)

        def turns(ep: Episode) -> int:
            # The whole script, inserted looks included: neither the turn budget nor the
            # simulator's move limit may cut a gold replay short (SciWorldEnvs).
            gold = list(ep.gold or [])
            return max(1, len(script(gold) if script is not None else gold))

        episodes = play(self, items, single(agent), None, None, gold=True, max_turns=turns)
        out = []
        for item, ep in zip(items, episodes, strict=True):
            if ep.error is not None:
                raise RuntimeError(f"sciworld: gold trajectory of {item.id} failed: {ep.error}")
            steps = [{"action": t.action, "observation": t.observation} for t in ep.turns]
            meta = {**item.meta, "gold_score": ep.score, "first": ep.first_observation, "steps": steps}
            out.append(
                Item(
                    id=item.id,
                    prompt=ep.first_observation,
                    answer=str(ep.score),
                    solution=json.dumps(steps),
                    meta=meta,
                )
            )
        return out

    # -- Domain API ----------------------------------------------------------------------
    def privileged_context(self, item: Item) -> str:
        """The OPSD teacher's privileged view of a task: its gold plan, the simulator's gold
        action sequence as the gold replay played it (`with_gold`)."""
        steps = item.meta.get("steps")
        if not steps:
            raise ValueError(f"sciworld item {item.id} has no gold trajectory: OPSD needs its gold plan")
        return "A plan that solves this task: " + "; ".join(str(s["action"]) for s in steps) + "."

    def score(self, item: Item, response: str) -> Score:
        raise NotImplementedError(
            "sciworld is multi-turn: episodes are scored by the simulator (distill.domains.sciworld.play)"
        )

    def corpus(self) -> list[str]:
        texts = [INSTRUCTION, FIRST_REPLY]
        for item in self.train_items():
            texts.append(item.prompt)
            for step in item.meta.get("steps", []):
                texts.append(format_response(step["action"]))
                texts.append(step["observation"])
        self.close()  # the items are materialised; no JVM needs to wait for the tokenizer
        return texts


def gold_messages(item: Item) -> list[dict[str, str]]:
    """An item's gold trajectory as AgentGym chat messages (after the fixed first reply)."""
    messages = [
        {"role": "user", "content": INSTRUCTION},
        {"role": "assistant", "content": FIRST_REPLY},
        {"role": "user", "content": item.meta["first"]},
    ]
    steps = item.meta["steps"]
    for i, step in enumerate(steps):
        messages.append({"role": "assistant", "content": format_response(step["action"])})
        if i + 1 < len(steps):
            messages.append({"role": "user", "content": step["observation"]})
    return messages


def look_before_focus(actions: list[str]) -> list[str]:
    """The gold actions with a "look around" before each "focus on" that directly follows a
    "go to": what the agent focuses on is then named in its context, not guessed."""
    out: list[str] = []
    for action in actions:
        if action.startswith("focus on") and out and out[-1].startswith("go to"):
            out.append("look around")
        out.append(action)
    return out


def build(config: SciWorldDomainConfig) -> SciWorldDomain:
    return SciWorldDomain(config)


__all__ = ["SciWorldDomain", "build", "first_observation", "gold_messages", "item_of", "look_before_focus"]
