"""The episodic-domain protocol: what a multi-turn domain provides for episodes to be played.

A domain is episodic when its items are played turn by turn against an environment: the model
writes a response, the domain parses an action out of it, the environment answers with an
observation and a score. `play()` (play.py) drives any domain that implements this protocol;
methods, evals and the zoo depend on the protocol, never on a particular domain. A new
multi-turn domain implements `EpisodicDomain` in `distill/domains/<name>/` and sets
`episodic=True` on its registry line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


class Task(Protocol):
    """An item to play (`distill.domains.base.Item` is one): an id and what the env needs."""

    @property
    def id(self) -> str: ...

    @property
    def meta(self) -> dict[str, Any]: ...


@dataclass
class EnvReply:
    """The environment's answer to a reset or a step."""

    observation: str
    # The task's score so far, in the domain's units (`EpisodicDomain.reward` maps it to a reward).
    score: int = 0
    done: bool = False
    # Moves the environment counted (may differ from turns: an unparsed response is no move).
    moves: int = 0
    # False when the environment did not recognise the action (it still answered).
    valid: bool = True
    # The scripted (gold) action sequence, on a reset that asked for it.
    gold: list[str] | None = None


class EnvSlots(Protocol):
    """`size` environments side by side, each playing one episode at a time."""

    @property
    def size(self) -> int: ...

    def reset_many(self, requests: Sequence[tuple[int, Task, bool]]) -> list[EnvReply | Exception]:
        """(slot, task, want_gold) -> the first observation; an Exception fails only its episode."""
        ...

    def step_many(self, requests: Sequence[tuple[int, str]]) -> list[EnvReply | Exception]:
        """(slot, action) -> the observation after the action; an Exception fails only its episode."""
        ...


@dataclass(frozen=True)
class Script:
    """The fixed text of a domain's conversation around the observations."""

    # The first user message (how to act, the response format).
    instruction: str
    # A fixed first assistant reply (never trained on), or None.
    first_reply: str | None
    # The observation that answers a response without a parseable action (no env step is taken).
    invalid_feedback: str


@runtime_checkable
class EpisodicDomain(Protocol):
    """What `play()`, the episode methods and the agent eval need of a multi-turn domain."""

    name: str
    script: Script

    @property
    def max_turns(self) -> int:
        """The turn budget: assistant turns before an episode is cut off."""
        ...

    def envs(self) -> EnvSlots:
        """The domain's environments, started on first use and reused (close() stops them)."""
        ...

    def parse_action(self, response: str) -> str | None:
        """The action a response takes, or None when it has none."""
        ...

    def action_text(self, action: str) -> str:
        """The response text of a scripted turn that takes `action` (gold episodes)."""
        ...

    def turn_end(self, response: str) -> int | None:
        """Where a response that runs on past its action ends (a length of its text), or None to
        keep it whole: `play()` ends the turn there with an EOS, as a stop string would."""
        ...

    def reward(self, score: int) -> float:
        """A final score as a reward, 1.0 for a solved task."""
        ...

    def solved(self, score: int) -> bool: ...


def as_episodic(domain: object) -> EpisodicDomain:
    """`domain` as an episodic domain, or a clear error naming what it lacks."""
    if not isinstance(domain, EpisodicDomain):
        name = getattr(domain, "name", type(domain).__name__)
        raise TypeError(
            f"domain {name} is not episodic: it does not implement distill.episodes.protocol.EpisodicDomain"
        )
    return domain
