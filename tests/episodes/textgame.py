"""A tiny deterministic text game: a multi-turn domain written as a user would add one.

This module is all a new episodic domain needs besides one registry line (see `ENTRY`): a config
model, the domain (`distill.domains.base.Domain` + `distill.episodes.protocol.EpisodicDomain`)
and a builder. The game: a counter starts at `start` and must reach `target`; each turn the agent
writes `Action: up` or `Action: down`. Reaching the target ends the episode with score 100.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from distill.config import DomainBase
from distill.domains.base import Domain, Item, Score
from distill.episodes.protocol import EnvReply, Script, Task
from distill.registry import DomainEntry

NAME = "textgame"
# The registry line a real domain would add to distill/registry.py's DOMAINS.
ENTRY = DomainEntry(f"{__name__}:build", f"{__name__}:TextGameConfig", episodic=True)

SCRIPT = Script(
    instruction="Move the counter to the target. Answer with `Action: up` or `Action: down`.",
    first_reply=None,
    invalid_feedback="Invalid. Write `Action: up` or `Action: down`.",
)


class TextGameConfig(DomainBase):
    name: Literal["textgame"] = "textgame"
    train_size: int = Field(8, ge=1)
    eval_size: int = Field(4, ge=1)
    max_turns: int = Field(6, ge=1)
    pool_size: int = Field(2, ge=1)
    # How far the target is from the start, at most.
    max_distance: int = Field(3, ge=1)
    # End a turn at its action line (`turn_end`), as SciWorld's `domain.stop_at_action` does.
    stop_at_action: bool = False


def observation(position: int, target: int) -> str:
    return f"The counter is at {position}. The target is {target}."


class Counters:
    """`size` games side by side, in this process (the environment slots of the protocol)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.state: dict[int, tuple[int, int, int]] = {}  # slot -> (position, target, moves)

    def reset_many(self, requests: Sequence[tuple[int, Task, bool]]) -> list[EnvReply | Exception]:
        out: list[EnvReply | Exception] = []
        for slot, task, gold in requests:
            start, target = int(task.meta["start"]), int(task.meta["target"])
            self.state[slot] = (start, target, 0)
            moves = ["up" if target > start else "down"] * abs(target - start)
            out.append(EnvReply(observation(start, target), gold=moves if gold else None))
        return out

    def step_many(self, requests: Sequence[tuple[int, str]]) -> list[EnvReply | Exception]:
        out: list[EnvReply | Exception] = []
        for slot, action in requests:
            position, target, moves = self.state[slot]
            if action not in ("up", "down"):
                out.append(EnvReply("No such move.", moves=moves, valid=False))
                continue
            position += 1 if action == "up" else -1
            self.state[slot] = (position, target, moves + 1)
            done = position == target
            score = 100 if done else 0
            out.append(EnvReply(observation(position, target), score=score, done=done, moves=moves + 1))
        return out


class TextGame(Domain):
    name = NAME
    script = SCRIPT

    def __init__(self, config: TextGameConfig) -> None:
        self.config = config
        self._envs: Counters | None = None

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    def envs(self) -> Counters:
        if self._envs is None:
            self._envs = Counters(self.config.pool_size)
        return self._envs

    def parse_action(self, response: str) -> str | None:
        head, sep, tail = response.rpartition("Action:")
        action = tail.strip().split("\n")[0].strip() if sep else ""
        return action or None

    def action_text(self, action: str) -> str:
        return f"Action: {action}"

    def turn_end(self, response: str) -> int | None:
        start = response.find("Action:")
        end = response.find("\n", start) if self.config.stop_at_action and start >= 0 else -1
        return end if end >= 0 and response[end:].strip() else None

    def reward(self, score: int) -> float:
        return score / 100.0

    def solved(self, score: int) -> bool:
        return score >= 100

    def _items(self, count: int, seed: int, prefix: str) -> list[Item]:
        rng = random.Random(seed)
        items = []
        for i in range(count):
            start = rng.randint(0, 9)
            target = start + rng.choice([-1, 1]) * rng.randint(1, self.config.max_distance)
            move = "up" if target > start else "down"
            steps: list[dict[str, Any]] = []
            position = start
            while position != target:
                position += 1 if move == "up" else -1
                steps.append({"action": move, "observation": observation(position, target)})
            first = observation(start, target)
            meta = {"start": start, "target": target, "first": first, "steps": steps, "gold_score": 100}
            items.append(Item(id=f"{prefix}-{i}", prompt=first, answer="100", meta=meta))
        return items

    def train_items(self) -> list[Item]:
        return self._items(self.config.train_size, 0, NAME)

    def eval_items(self) -> list[Item]:
        return self._items(self.config.eval_size, self.config.eval_seed, f"{NAME}-eval")

    def score(self, item: Item, response: str) -> Score:
        raise NotImplementedError("textgame is multi-turn: episodes are scored by the game")


def build(config: TextGameConfig) -> TextGame:
    return TextGame(config)
