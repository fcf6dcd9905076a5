"""Episodes as training data: token sequences with labels on chosen writers, gold replays,
re-encoding into another tokenizer family through the tokenizer bridge, and the `env/` figures
of a batch.

An `Episode` is the exact token sequence the model saw, with every assistant turn tagged by its
writer. Training rows keep the sequence and put labels only on the turns of the writers being
imitated (teacher turns for ROSE and teacher-SFT, gold turns for a zoo agent); environment text,
template tokens and a fixed first reply are never labelled.

A domain's training items may carry a recorded scripted play (`meta["first"]`, the first
observation; `meta["steps"]`, a list of {action, observation}; `meta["gold_score"]`), which
`replay_gold` turns into an episode without an environment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from distill.engines.base import Completion
from distill.episodes.episode import BridgedCompletion, Episode, frame_for
from distill.episodes.play import end_turn
from distill.tokenizer_bridge.bridge import trim_partial

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.episodes.episode import ChatFrame
    from distill.episodes.play import EngineAgent
    from distill.episodes.protocol import EpisodicDomain, Script, Task
    from distill.tokenizer_bridge.bridge import TokenizerBridge

IGNORE = -100
# The writer of the malformed turns `replay_gold` can insert (never a training target).
SLIP = "slip"


def episode_example(
    ep: Episode, writers: Iterable[str], valid_only: bool = False
) -> tuple[list[int], list[int]]:
    """(input_ids, labels): labels are the ids on the writers' turns (`valid_only`: those whose
    action the environment accepted), -100 elsewhere."""
    mask = ep.mask(frozenset(writers), valid_only)
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
    ep: Episode,
    bridge: TokenizerBridge,
    frame: ChatFrame,
    script: Script,
    to_teacher: bool,
    ongoing: bool = False,
    own: dict[int, list[int]] | None = None,
) -> Episode:
    """The same episode in the other side's tokens, turn by turn through the tokenizer bridge
    (cross-family data): student -> teacher with `to_teacher`, else teacher -> student.

    Each turn's exact ids cross on their own (special tokens by role or name, text re-encoded
    with special-token matching off, a truncated turn's unfinished character dropped), so turn
    boundaries and writers carry over and a turn that ended with EOS ends with the other side's
    EOS; a turn that did not cross losslessly is marked `seam_ok=False`. `own`: turns (by index)
    already in the far side's tokens, kept as they are (a bridged writer's own turns). `ongoing`:
    the episode is still being played, so its last observation is encoded too.
    """
    source = bridge.student if to_teacher else bridge.teacher
    convert = bridge.to_teacher if to_teacher else bridge.to_student
    out = Episode(
        item=ep.item,
        worker=ep.worker,
        tokenizer=bridge.teacher if to_teacher else bridge.student,
        frame=frame,
        position=ep.position,
    )
    out.begin(ep.first_observation, script)
    for i, turn in enumerate(ep.turns):
        if own is not None and i in own:
            ids, lossless = own[i], True
        else:
            moved = convert(trim_partial(source, turn.ids) if turn.truncated else turn.ids)
            ids, lossless = moved.ids, moved.lossless
        new = out.add_turn(
            turn.writer,
            ids,
            turn.response,
            turn.truncated,
            turn.action,
            source_tokens=turn.own_tokens,
            seam_ok=turn.seam_ok and lossless,
        )
        out.add_observation(turn.observation, last=not ongoing and i + 1 == len(ep.turns))
        new.valid, new.score = turn.valid, turn.score
    out.score, out.done, out.error, out.moves = ep.score, ep.done, ep.error, ep.moves
    return out


class BridgedAgent:
    """A model of another tokenizer family writing turns of episodes held in the student's
    tokens (cross-family ROSE), through the tokenizer bridge turn by turn: it reads each episode
    with every student turn's ids crossed to its own tokens (its own earlier turns kept as it
    wrote them, so its KV cache stays a prefix) in its own chat template, and its turn's ids
    cross back into the episode's tokens, special tokens by role and never as text."""

    def __init__(
        self,
        agent: EngineAgent,
        script: Script,
        bridge: TokenizerBridge,
        turn_end: Callable[[str], int | None] | None = None,
    ) -> None:
        self.agent = agent
        self.writer = agent.writer
        self.script = script
        self.bridge = bridge
        # The domain's end of a turn (`EpisodicDomain.turn_end`): a turn is cut there in the
        # writer's own tokens, as a same-family turn is in the episode's (play.end_turn).
        self.turn_end = turn_end
        engine = agent.engine
        self.frame = frame_for(engine.tokenizer, engine.enable_thinking)
        # Per episode (by uid): its turns this agent wrote, by turn index, in the agent's ids.
        self.own: dict[int, dict[int, list[int]]] = {}

    def act(self, episodes: Sequence[Episode]) -> list[Completion]:
        # Episodes leave the agent only when they end (ROSE never hands back to the student).
        self.own = {ep.uid: self.own.get(ep.uid, {}) for ep in episodes}
        views = []
        for ep in episodes:
            view = retokenize(
                ep, self.bridge, self.frame, self.script, to_teacher=True, ongoing=True, own=self.own[ep.uid]
            )
            # The view of turn t+1 extends the view of turn t: the agent's KV cache carries over.
            view.uid = ep.uid
            views.append(view)
        out: list[Completion] = []
        for ep, view, comp in zip(episodes, views, self.agent.act(views), strict=True):
            if view.error is not None:  # the agent could not write this turn (its context is full)
                ep.error = view.error
            written = comp
            if self.turn_end is not None:  # its run-on text (an invented observation) never crosses
                comp = end_turn(comp, self.turn_end(comp.text), self.bridge.teacher)
            # What the episode holds of this turn is what the agent reads of it next turn.
            self.own[ep.uid][len(ep.turns)] = list(comp.ids)
            kept = trim_partial(self.bridge.teacher, comp.ids) if comp.truncated else list(comp.ids)
            back = self.bridge.to_student(kept)
            # The turn's text as the engines give it: its text pieces, special tokens left out.
            text = "".join(piece.text for piece in back.source if not piece.special)
            out.append(
                BridgedCompletion(
                    ids=back.ids,
                    text=text,
                    truncated=comp.truncated,
                    source_tokens=len(comp.ids),
                    seam_ok=view.seam_ok and back.lossless,
                    stopped=comp is not written,
                )
            )
        return out


def seam_failure_rate(episodes: Sequence[Episode], writer: str = "teacher") -> float:
    """Share of the episodes with a `writer` turn that did not cross the bridge losslessly
    (they are left out of the loss)."""
    bridged = [ep for ep in episodes if any(t.writer == writer for t in ep.turns)]
    return sum(not ep.seam_ok for ep in bridged) / len(bridged) if bridged else 0.0


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
