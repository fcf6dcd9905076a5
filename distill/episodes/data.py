"""Episodes as training data: token sequences with labels on chosen writers, gold replays,
re-encoding into another tokenizer, and the `env/` figures of a batch.

An `Episode` is the exact token sequence the model saw, with every assistant turn tagged by its
writer. Training rows keep the sequence and put labels only on the turns of the writers being
imitated (teacher turns for ROSE and teacher-SFT, gold turns for a zoo agent); environment text,
template tokens and a fixed first reply are never labelled.

A domain's training items may carry a recorded scripted play (`meta["first"]`, the first
observation; `meta["steps"]`, a list of {action, observation}; `meta["gold_score"]`), which
`replay_gold` turns into an episode without an environment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from distill.episodes.episode import Episode, frame_for

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.engines.base import Completion
    from distill.episodes.episode import ChatFrame
    from distill.episodes.play import EngineAgent
    from distill.episodes.protocol import EpisodicDomain, Script, Task

IGNORE = -100
# The writer of the malformed turns `replay_gold` can insert (never a training target).
SLIP = "slip"


def episode_example(ep: Episode, writers: Iterable[str]) -> tuple[list[int], list[int]]:
    """(input_ids, labels): labels are the ids on the writers' turns, -100 elsewhere."""
    mask = ep.mask(frozenset(writers))
    if len(mask) != len(ep.ids):
        raise ValueError(f"episode {ep.item.id}: {len(ep.ids)} ids but {len(mask)} mask entries")
    return list(ep.ids), [tok if m else IGNORE for tok, m in zip(ep.ids, mask, strict=True)]


def turn_ids(tokenizer: PreTrainedTokenizerBase, text: str, truncated: bool) -> list[int]:
    """A turn's text in `tokenizer`'s ids, ending with its EOS unless the turn was cut off."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids if truncated else [*ids, tokenizer.eos_token_id]


def replay_gold(
    item: Task,
    domain: EpisodicDomain,
    tokenizer: PreTrainedTokenizerBase,
    frame: ChatFrame,
    writer: str = "gold",
    slip: tuple[int, int] | None = None,
) -> Episode:
    """An item's recorded gold play as an episode token sequence, without an environment.

    The sequence is built by the same code that builds a live episode. `slip=(turn, words)`
    puts a malformed turn (writer `SLIP`) before gold turn `turn`: that turn's first `words`
    words of reasoning (its text before the final paragraph, which holds the action), answered
    by the domain's invalid-action feedback, as a live episode would be. It takes no environment step, and the gold play goes on.
    """
    steps = item.meta.get("steps")
    if not steps:
        raise ValueError(f"item {item.id} carries no gold steps")
    ep = Episode(item=item, worker=-1, tokenizer=tokenizer, frame=frame)
    ep.begin(str(item.meta["first"]), domain.script)
    for i, step in enumerate(steps):
        text = domain.action_text(step["action"])
        if slip is not None and slip[0] == i:
            # The reasoning before the response's final paragraph, where the action stands.
            words = text.rsplit("\n\n", 1)[0].split(" ")
            cut = " ".join(words[: max(1, min(slip[1], len(words)))])
            ep.add_turn(SLIP, turn_ids(tokenizer, cut, False), cut, False, None)
            ep.invalid(domain.script, last=False)
        ep.add_turn(writer, turn_ids(tokenizer, text, False), text, False, step["action"])
        ep.add_observation(step["observation"], last=i + 1 == len(steps))
    ep.score = int(item.meta.get("gold_score", 0))
    ep.done = True
    return ep


def retokenize(
    ep: Episode, tokenizer: PreTrainedTokenizerBase, frame: ChatFrame, script: Script, ongoing: bool = False
) -> Episode:
    """The same episode in another tokenizer's tokens, turn by turn (cross-family data).

    Each turn's text is re-encoded on its own, so turn boundaries and writers carry over; a turn
    that ended with EOS ends with the new tokenizer's EOS. `ongoing`: the episode is still being
    played, so its last observation is encoded too, ready for the next turn.
    """
    out = Episode(item=ep.item, worker=ep.worker, tokenizer=tokenizer, frame=frame)
    out.begin(ep.first_observation, script)
    for i, turn in enumerate(ep.turns):
        ids = turn_ids(tokenizer, turn.response, turn.truncated)
        new = out.add_turn(turn.writer, ids, turn.response, turn.truncated, turn.action)
        out.add_observation(turn.observation, last=not ongoing and i + 1 == len(ep.turns))
        new.valid, new.score = turn.valid, turn.score
    out.score, out.done, out.error, out.moves = ep.score, ep.done, ep.error, ep.moves
    return out


class BridgedAgent:
    """A model of another tokenizer family writing turns of episodes held in the student's
    tokens (cross-family ROSE): it reads each episode re-encoded turn by turn in its own
    tokens and its turn's text comes back re-encoded in the episode's tokens."""

    def __init__(self, agent: EngineAgent, script: Script) -> None:
        self.agent = agent
        self.writer = agent.writer
        self.script = script
        engine = agent.engine
        self.tokenizer = engine.tokenizer
        self.frame = frame_for(engine.tokenizer, engine.enable_thinking)

    def act(self, episodes: Sequence[Episode]) -> list[Completion]:
        from distill.engines.base import Completion

        views = []
        for ep in episodes:
            view = retokenize(ep, self.tokenizer, self.frame, self.script, ongoing=True)
            # The view of turn t+1 extends the view of turn t: the agent's KV cache carries over.
            view.uid = ep.uid
            views.append(view)
        out = []
        for ep, view, comp in zip(episodes, views, self.agent.act(views), strict=True):
            if view.error is not None:  # the agent could not write this turn (its context is full)
                ep.error = view.error
            if ep.tokenizer is None:
                raise ValueError(f"episode {ep.item.id} is text-only: nothing to re-encode into")
            ids = turn_ids(ep.tokenizer, comp.text, comp.truncated)
            out.append(Completion(ids=ids, text=comp.text, truncated=comp.truncated))
        return out


def episode_stats(episodes: list[Episode], domain: EpisodicDomain) -> dict[str, float]:
    """The `env/` figures of DESIGN.md for a batch of episodes."""
    if not episodes:
        return {}
    n = len(episodes)
    turns = [t for ep in episodes for t in ep.turns]
    return {
        "env/turns_mean": sum(len(ep.turns) for ep in episodes) / n,
        "env/student_turns_mean": sum(ep.count("student") for ep in episodes) / n,
        "env/teacher_turns_mean": sum(ep.count("teacher") for ep in episodes) / n,
        "env/invalid_action_rate": sum(not t.valid for t in turns) / max(len(turns), 1),
        "env/score_mean": sum(0.0 if ep.failed else domain.reward(ep.score) for ep in episodes) / n,
        "env/success_rate": sum((not ep.failed) and domain.solved(ep.score) for ep in episodes) / n,
        "env/step_time_s": sum(ep.env_seconds for ep in episodes) / max(len(turns), 1),
        "env/failed_episodes": float(sum(ep.failed for ep in episodes)),
    }


def writer_turns(episodes: Sequence[Episode], writer: str) -> tuple[list[int], list[bool]]:
    """Token counts and truncation flags of every turn `writer` wrote."""
    turns = [t for ep in episodes for t in ep.turns if t.writer == writer]
    return [t.tokens for t in turns], [t.truncated for t in turns]


def record_rows(
    episodes: Sequence[Episode], domain: EpisodicDomain, extra: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Episodes as JSON rows (samples, data files)."""
    return [{**ep.record(domain), **(extra or {})} for ep in episodes]
