"""Gold episodes with the student's kind of mistakes in them, played through the simulator.

A teacher trained on flawless gold episodes has never read a failed action's reply: in a
student's episode, after "go to kitchen" was answered "The door is not open.", it writes the
same action again, or text that is no action at all (on sciworld's OPD student, where it
repeated its last action: the teacher repeated it too in 72 of 265 turns, and wrote no action or
the next observation in most others), and OPD then distils that.
A detour episode is an item's gold play with one mistake before one gold turn, played one to
three times, each answered by the simulator itself; the gold play then goes on. The mistake is
another action of the same play: a later one too early (a door not yet opened, a room not yet
reached), an earlier one again, which is what a student's loops are made of ("go to outside"
from the hallway). The mistaken turns are written by `SLIP` (never labelled), so the model
learns what follows a mistake, not to make it. An episode whose detour changed what the gold
play reaches (its final score differs from the gold one) is dropped.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from distill.episodes.data import SLIP
from distill.episodes.episode import frame_for
from distill.episodes.play import ScriptedAgent, play

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.domains.base import Item
    from distill.episodes.episode import Episode
    from distill.episodes.protocol import EpisodicDomain


def detour_plan(actions: list[str], rng: random.Random) -> tuple[list[str], set[int]]:
    """`actions` with one run of one mistaken action (another action of the same play) inserted
    before a gold turn, and the turn indices that hold it."""
    at = rng.randrange(len(actions))
    choices = sorted(set(actions) - {actions[at]})
    if not choices:
        return list(actions), set()
    wrong = rng.choice(choices)
    times = rng.randint(1, 3)
    return actions[:at] + [wrong] * times + actions[at:], set(range(at, at + times))


class _PlanAgent(ScriptedAgent):
    """Writes turn k of its episode's plan (by item position), as `writer`."""

    def __init__(self, domain: EpisodicDomain, plans: dict[int, list[str]], writer: str) -> None:
        super().__init__(domain.action_text, writer)
        self.plans = plans

    def plan(self, ep: Episode) -> list[str]:
        return self.plans[ep.position]


def detour_episodes(
    items: list[Item],
    domain: EpisodicDomain,
    tokenizer: PreTrainedTokenizerBase,
    share: float,
    seed: int = 0,
) -> list[Episode]:
    """That `share` of the items' gold plays, each with one detour, played through the domain's
    simulator as token episodes (gold turns by "gold", the detour's by `SLIP`)."""
    rng = random.Random(f"detours:{seed}")
    chosen = [i for i in items if rng.random() < share and i.meta.get("steps")]
    plans: dict[int, list[str]] = {}
    wrong: dict[int, set[int]] = {}
    for k, item in enumerate(chosen):
        plans[k], wrong[k] = detour_plan([str(s["action"]) for s in item.meta["steps"]], rng)
    gold, slip = _PlanAgent(domain, plans, "gold"), _PlanAgent(domain, plans, SLIP)

    def policy(ep: Episode) -> ScriptedAgent:
        return slip if len(ep.turns) in wrong[ep.position] else gold

    # gold=True: played as a replay, which the simulator's move limit does not cut short.
    episodes = play(
        domain,
        chosen,
        policy,
        tokenizer,
        frame_for(tokenizer, None),
        gold=True,
        max_turns=lambda ep: len(plans[ep.position]),
    )
    return [
        ep
        for item, ep in zip(chosen, episodes, strict=True)
        if ep.error is None and ep.score == int(item.meta.get("gold_score", 0))
    ]
