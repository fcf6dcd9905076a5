"""One episode as one token sequence, with who wrote each assistant turn.

The sequence is built by concatenation, the way the model sees it while playing: the chat
template's pieces (`ChatFrame`) around the instruction and each observation are environment
tokens; each assistant turn is the exact ids its writer generated (ending in EOS unless it hit
the turn budget). `mask(writers)` is 1 on the tokens of the turns written by `writers` and 0
everywhere else: environment text and template tokens are always 0, the fixed first reply too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distill.engines.base import Completion

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.episodes.protocol import EpisodicDomain, Script, Task

# Writer of template/instruction/observation tokens; never trained on.
ENV = "env"
# Writer of AgentGym's fixed first assistant reply ("loss": False there).
FIXED = "fixed"

_U1, _A1, _U2 = "\u2063USER-ONE\u2063", "\u2063ASSISTANT-ONE\u2063", "\u2063USER-TWO\u2063"


@dataclass(frozen=True)
class ChatFrame:
    """The template text around messages, cut out of the tokenizer's own chat template."""

    head: str  # before the first user message's content
    gen: str  # after a user message's content, through the assistant header
    between: str  # after an assistant message's content, through the next user header
    eos_text: str  # the end-of-turn text a model emits (its EOS token), when `between` starts with it

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, enable_thinking: bool | None = None) -> ChatFrame:
        kwargs: dict[str, Any] = {}
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking

        def render(messages: list[dict[str, str]]) -> str:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **kwargs
            )
            return str(text)

        one = render([{"role": "user", "content": _U1}])
        two = render(
            [
                {"role": "user", "content": _U1},
                {"role": "assistant", "content": _A1},
                {"role": "user", "content": _U2},
            ]
        )
        if one.count(_U1) != 1 or _A1 not in two or _U2 not in two:
            raise ValueError(f"chat template of {tokenizer.name_or_path!r} does not render plain messages")
        head, gen = one.split(_U1)
        between = two[two.index(_A1) + len(_A1) : two.index(_U2)]
        eos = tokenizer.eos_token or ""
        return cls(head=head, gen=gen, between=between, eos_text=eos if between.startswith(eos) else "")


def frame_for(tokenizer: PreTrainedTokenizerBase, enable_thinking: bool | None) -> ChatFrame:
    """The chat frame episodes are played in: thinking off unless the model config says on."""
    return ChatFrame.of(tokenizer, False if enable_thinking is None else enable_thinking)


_uids = itertools.count()


@dataclass(frozen=True)
class BridgedCompletion(Completion):
    """A turn written in another tokenizer family, in the episode's ids: how many tokens the
    writer generated in its own tokenizer (what its budget counts), and whether the turn and the
    context it was written from crossed the bridge losslessly."""

    source_tokens: int = 0
    seam_ok: bool = True
    # Cut at the domain's end of a turn in the writer's own tokens (Turn.stopped).
    stopped: bool = False


@dataclass
class Turn:
    writer: str
    response: str
    tokens: int
    truncated: bool
    action: str | None
    observation: str = ""
    score: int = 0
    valid: bool = True
    # The turn's exact ids in the episode's tokens (what re-encoding into another family reads).
    ids: list[int] = field(default_factory=list, repr=False)
    # Tokens the writer generated in its own tokenizer, when that differs from the episode's (a
    # bridged teacher): budgets count these, the mask counts `tokens` (DESIGN.md).
    source_tokens: int | None = None
    # False when the turn crossed the tokenizer bridge lossily (its tokens are not trained on).
    seam_ok: bool = True
    # True when the writer ran on past its action and the turn was ended there (`play.end_turn`).
    stopped: bool = False

    @property
    def own_tokens(self) -> int:
        """Tokens in the writer's own tokenizer: what its turn budget counted."""
        return self.tokens if self.source_tokens is None else self.source_tokens


@dataclass
class Episode:
    item: Task
    worker: int
    # None: a text-only episode (no token sequence), e.g. to record gold trajectories.
    tokenizer: PreTrainedTokenizerBase | None
    frame: ChatFrame | None
    ids: list[int] = field(default_factory=list)
    # (start, end, writer) per stretch of tokens; stretches cover `ids` exactly.
    spans: list[tuple[int, int, str]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    score: int = 0
    done: bool = False
    error: str | None = None
    env_seconds: float = 0.0
    moves: int = 0
    # The simulator's gold action sequence, when the reset asked for it.
    gold: list[str] | None = None
    first_observation: str = ""
    # The content of the first user message (the instruction, and the first observation when no
    # fixed reply comes between): what a privileged teacher view rewrites (OPSD).
    first_message: str = ""
    # The item's position in the list `play()` was given (-1 outside play): per-episode draws are
    # keyed by it, so they do not depend on which episode an environment slot happened to start.
    position: int = -1
    # Never reused within a process (unlike id()): engines key per-episode state by it.
    uid: int = field(default_factory=_uids.__next__)

    # -- building the sequence ------------------------------------------------------------
    def _append(self, ids: list[int], writer: str) -> None:
        if not ids:
            return
        start = len(self.ids)
        self.ids.extend(ids)
        self.spans.append((start, len(self.ids), writer))

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return []
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def begin(self, first: str, script: Script) -> None:
        """The domain's instruction, its fixed first reply (if any), and the first observation;
        ready for turn 1."""
        self.first_observation = first
        if self.tokenizer is None or self.frame is None:
            return
        frame = self.frame
        if script.first_reply is None:
            self.first_message = script.instruction + "\n\n" + first
            self._append(self._encode(frame.head + self.first_message + frame.gen), ENV)
            return
        self.first_message = script.instruction
        self._append(self._encode(frame.head + self.first_message + frame.gen), ENV)
        eos = [self.tokenizer.eos_token_id] if frame.eos_text else []
        self._append(self._encode(script.first_reply) + eos, FIXED)
        self._append(self._encode(self._after_turn(True) + self.first_observation + frame.gen), ENV)

    def _after_turn(self, ended_with_eos: bool) -> str:
        # A turn that ended with EOS already holds the template's end-of-turn token.
        if self.frame is None:
            return ""
        between = self.frame.between
        if ended_with_eos and self.frame.eos_text:
            return between[len(self.frame.eos_text) :]
        return between

    def add_turn(
        self,
        writer: str,
        ids: list[int],
        text: str,
        truncated: bool,
        action: str | None,
        source_tokens: int | None = None,
        seam_ok: bool = True,
    ) -> Turn:
        """An assistant turn: its exact ids (ending in EOS unless cut at the budget) and the
        action the domain parsed from its text (None: no action, answered by the script's
        invalid-action feedback). A bridged writer's turn also says how many tokens it wrote in
        its own tokenizer and whether it crossed the bridge losslessly."""
        self._append(list(ids), writer)
        turn = Turn(
            writer=writer,
            response=text,
            tokens=len(ids),
            truncated=truncated,
            action=action,
            ids=list(ids),
            source_tokens=source_tokens,
            seam_ok=seam_ok,
        )
        turn.valid = turn.action is not None
        self.turns.append(turn)
        return turn

    def add_observation(self, observation: str, last: bool, valid: bool = True) -> None:
        """The environment's answer to the last turn; the final one is recorded, not tokenised.
        `valid` False: the environment did not recognise the turn's action."""
        turn = self.turns[-1]
        turn.observation = observation
        if not valid:
            turn.valid = False
        if not last and self.frame is not None:
            self._append(
                self._encode(self._after_turn(not turn.truncated) + observation + self.frame.gen), ENV
            )

    def invalid(self, script: Script, last: bool) -> None:
        """The answer to a turn without an action: the script's feedback, no env step."""
        self.add_observation(script.invalid_feedback, last)

    def privileged_prompt(self, message: str) -> tuple[list[int], int]:
        """The teacher's view of this episode's start (OPSD): the first span encoded again with
        `message` as the first user message, and where that span ends in `ids`. Every token after
        it is the same in both views, so the teacher scores `ids[end:]` after its own start."""
        if self.frame is None or not self.spans:
            raise ValueError("privileged_prompt: a text-only or empty episode has no token view")
        return self._encode(self.frame.head + message + self.frame.gen), self.spans[0][1]

    def privileged_view(self, context: str) -> tuple[list[int], list[int]]:
        """The teacher's view with `context` at the end of every user message (OPSD's privileged
        context turn by turn), and where each of `ids` sits in it: every token but the inserted
        ones is this episode's own, so the teacher's scores are read back at those places."""
        if self.frame is None or not self.spans:
            raise ValueError("privileged_view: a text-only or empty episode has no token view")
        gen, extra = self._encode(self.frame.gen), self._encode("\n\n" + context.strip())
        view: list[int] = []
        where: list[int] = []
        for start, end, writer in self.spans:
            cut = end
            if writer == ENV and self.ids[start:end][-len(gen) :] == gen:
                cut = end - len(gen)  # a user message: the context goes before its assistant header
            where.extend(range(len(view), len(view) + cut - start))
            view.extend(self.ids[start:cut])
            if cut < end:
                view.extend(extra)
                where.extend(range(len(view), len(view) + end - cut))
                view.extend(self.ids[cut:end])
        if len(view) == len(self.ids):  # a tokenizer that merges across the header would land here
            raise ValueError(
                "privileged_view: no user message ends with the chat template's assistant header"
            )
        return view, where

    # -- reading it ----------------------------------------------------------------------
    def mask(
        self, writers: set[str] | frozenset[str] | tuple[str, ...], valid_only: bool = False
    ) -> list[int]:
        """1 on the tokens of the assistant turns written by `writers`, 0 elsewhere; `valid_only`:
        only on the turns whose action the environment accepted."""
        out = [0] * len(self.ids)
        spans = self.turn_spans()
        if valid_only and len(spans) != len(self.turns):
            raise ValueError(f"episode {self.item.id}: {len(self.turns)} turns but {len(spans)} turn spans")
        keep = [turn.valid for turn in self.turns] if valid_only else [True] * len(spans)
        for (start, end, writer), kept in zip(spans, keep, strict=True):
            if writer in writers and kept:
                out[start:end] = [1] * (end - start)
        return out

    def turn_spans(self) -> list[tuple[int, int, str]]:
        """The spans of assistant turns (excluding the fixed first reply), in order."""
        return [s for s in self.spans if s[2] not in (ENV, FIXED)]

    def count(self, writer: str) -> int:
        return sum(1 for t in self.turns if t.writer == writer)

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def seam_ok(self) -> bool:
        """Every turn that crossed the tokenizer bridge did so losslessly."""
        return all(t.seam_ok for t in self.turns)

    def record(self, domain: EpisodicDomain) -> dict[str, Any]:
        """The episode as one JSON row (samples, eval files)."""
        return {
            "id": self.item.id,
            "task": self.item.meta.get("task_id"),
            "variation": self.item.meta.get("variation"),
            "score": self.score,
            "reward": domain.reward(self.score),
            "success": domain.solved(self.score),
            "turns": len(self.turns),
            "writers": [t.writer for t in self.turns],
            "invalid_actions": sum(not t.valid for t in self.turns),
            "truncated_turns": sum(t.truncated for t in self.turns),
            "tokens": len(self.ids),
            "moves": self.moves,
            "env_seconds": round(self.env_seconds, 3),
            "error": self.error,
            "actions": [t.action for t in self.turns],
            # Cross-family episodes: whether every bridged turn crossed losslessly (trained on).
            **({"seam_ok": self.seam_ok} if any(t.source_tokens is not None for t in self.turns) else {}),
        }
