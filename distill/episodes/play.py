"""Playing episodes: every active episode takes its turn together, on any episodic domain.

Each turn, the active episodes are grouped by the agent the policy picks for them (student,
teacher, a scripted gold player), each agent writes its turns in one call, then every parsed
action goes to its episode's environment slot at once (the slots step in parallel). An
environment that fails fails its episode with a clear error; the next item goes on.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from distill.engines.base import Completion
from distill.episodes.episode import BridgedCompletion, ChatFrame, Episode

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.config import Sampling
    from distill.engines.base import Completion, Engine, KVCache
    from distill.episodes.protocol import EnvReply, EnvSlots, EpisodicDomain, Task


class Agent(Protocol):
    writer: str

    def act(self, episodes: Sequence[Episode]) -> list[Completion]: ...


class EngineAgent:
    """A model writing turns (each as `sampling` says: at most its max_new_tokens) from the
    episode's own token sequence."""

    def __init__(
        self,
        engine: Engine,
        writer: str,
        sampling: Sampling,
        batch_size: int = 64,
        reuse_cache: bool = True,
    ) -> None:
        self.engine = engine
        self.writer = writer
        self.sampling = sampling
        self.batch_size = batch_size
        # Per episode (by uid): the KV cache of its last turn. Only the new observation is
        # prefilled each turn; batching episodes instead re-reads every whole context.
        self.caches: dict[int, KVCache] = {}
        self.reuse_cache = reuse_cache and engine.supports_cache

    def act(self, episodes: Sequence[Episode]) -> list[Completion]:
        # The context policy (engines/context.py): an episode that has filled the model's context
        # ends here, failed with the reason, rather than running past the model's positions.
        context = self.engine.context
        full = [context is not None and len(ep.ids) >= context for ep in episodes]
        for ep, is_full in zip(episodes, full, strict=True):
            if is_full:
                ep.error = f"context full: the episode holds {len(ep.ids)} tokens, the model takes {context}"
        if any(full):
            live = [ep for ep, is_full in zip(episodes, full, strict=True) if not is_full]
            done = iter(self.act(live))
            return [Completion([], "", True) if is_full else next(done) for is_full in full]
        if self.reuse_cache:
            # Episodes leave an agent for good (they end, or ROSE hands them to the teacher).
            uids = {ep.uid for ep in episodes}
            self.caches = {uid: c for uid, c in self.caches.items() if uid in uids}
            out = []
            # The episodes' turns decode together, each from its own cache (engines/batched.py).
            for start in range(0, len(episodes), self.batch_size):
                chunk = episodes[start : start + self.batch_size]
                results = self.engine.continue_many(
                    [ep.ids for ep in chunk], [self.caches.get(ep.uid) for ep in chunk], self.sampling
                )
                for ep, (completion, cache) in zip(chunk, results, strict=True):
                    self.caches[ep.uid] = cache
                    out.append(completion)
            return out
        return self.engine.generate([ep.ids for ep in episodes], self.sampling, batch_size=self.batch_size)


class ScriptedAgent:
    """Plays the environment's scripted (gold) action sequence; needs `play(..., gold=True)`.

    `action_text` writes an action as a response in the domain's format; `script` may rewrite
    the action list first (a domain's own adjustments to its gold paths)."""

    def __init__(
        self,
        action_text: Callable[[str], str],
        writer: str = "gold",
        script: Callable[[list[str]], list[str]] | None = None,
        fallback: str = "look around",
    ) -> None:
        self.action_text = action_text
        self.writer = writer
        self.script = script
        self.fallback = fallback

    def act(self, episodes: Sequence[Episode]) -> list[Completion]:
        out = []
        for ep in episodes:
            gold = self.plan(ep)
            action = gold[len(ep.turns)] if len(ep.turns) < len(gold) else self.fallback
            text = self.action_text(action)
            ids: list[int] = []
            if ep.tokenizer is not None:
                ids = list(ep.tokenizer(text, add_special_tokens=False)["input_ids"])
                ids.append(ep.tokenizer.eos_token_id)
            out.append(Completion(ids=ids, text=text, truncated=False))
        return out

    def plan(self, ep: Episode) -> list[str]:
        """The actions this agent plays in `ep`, turn by turn."""
        gold = list(ep.gold or [])
        return self.script(gold) if self.script is not None else gold


Policy = Callable[[Episode], Agent]


def single(agent: Agent) -> Policy:
    return lambda ep: agent


def handover(first: Agent, then: Agent, turns: int | Callable[[Episode], int]) -> Policy:
    """`first` writes the first N turns, `then` the rest (ROSE); N fixed or chosen per episode."""

    def pick(ep: Episode) -> Agent:
        n = turns(ep) if callable(turns) else turns
        return first if len(ep.turns) < n else then

    return pick


class _Table:
    """The episodes in flight (slot -> (item position, episode)) and those done."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        self.active: dict[int, tuple[int, Episode]] = {}
        self.done: dict[int, Episode] = {}
        self.progress = progress

    def finish(self, slot: int | None, position: int, ep: Episode) -> None:
        if slot is not None:
            del self.active[slot]
        self.done[position] = ep
        if self.progress is not None:
            self.progress(1)


TurnBudget = int | Callable[[Episode], int]


def play(
    domain: EpisodicDomain,
    items: Sequence[Task],
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase | None,
    frame: ChatFrame | None,
    gold: bool = False,
    max_turns: TurnBudget | None = None,
    on_turn: Callable[[Episode], None] | None = None,
    progress: Callable[[int], None] | None = None,
    max_tokens: int | None = None,
) -> list[Episode]:
    """Play one episode per item; episodes come back in item order, failed ones with `error`.

    `tokenizer` None plays text-only episodes (no token sequence); `gold` asks each reset for the
    scripted action sequence; `max_turns` overrides the domain's turn budget, as a number or
    per episode (a gold replay's budget is its own script's length). `max_tokens` ends an episode
    whose token sequence has reached it, with the score it has (AgentGym bounds a whole
    conversation so, not each turn)."""
    envs = domain.envs()
    limit: TurnBudget = max_turns if max_turns is not None else domain.max_turns
    queue: deque[tuple[int, Task]] = deque(enumerate(items))
    table = _Table(progress)
    while queue or table.active:
        starts = []
        for slot in range(envs.size):
            if slot not in table.active and queue:
                starts.append((slot, *queue.popleft()))
        if starts:
            replies = envs.reset_many([(slot, item, gold) for slot, _, item in starts])
            for (slot, position, item), reply in zip(starts, replies, strict=True):
                ep = Episode(item=item, worker=slot, tokenizer=tokenizer, frame=frame, position=position)
                if isinstance(reply, Exception):
                    ep.error = f"reset failed: {reply}"
                    table.finish(None, position, ep)
                    continue
                ep.gold = reply.gold
                ep.score = reply.score
                ep.begin(reply.observation, domain.script)
                table.active[slot] = (position, ep)
        if table.active:
            _write_turns(domain, table, policy)
            _step(domain, envs, table, limit, on_turn, max_tokens)
    return [table.done[i] for i in range(len(items))]


def _write_turns(domain: EpisodicDomain, table: _Table, policy: Policy) -> None:
    """Every active episode's next assistant turn, one batched call per agent."""
    groups: dict[int, tuple[Agent, list[int]]] = {}
    for slot, (_, ep) in table.active.items():
        agent = policy(ep)
        groups.setdefault(id(agent), (agent, []))[1].append(slot)
    for agent, slots in groups.values():
        completions = agent.act([table.active[s][1] for s in slots])
        if len(completions) != len(slots):
            raise ValueError(f"agent {agent.writer} wrote {len(completions)} turns for {len(slots)} episodes")
        for slot, comp in zip(slots, completions, strict=True):
            position, ep = table.active[slot]
            if ep.error is not None:  # the agent could not write this turn (e.g. its context is full)
                table.finish(slot, position, ep)
                continue
            # A bridged writer's turn says what it cost in its own tokens and whether it crossed.
            source_tokens, seam_ok = (
                (comp.source_tokens, comp.seam_ok) if isinstance(comp, BridgedCompletion) else (None, True)
            )
            written = comp
            if source_tokens is None:  # a bridged turn was cut by its agent, in its own tokens
                comp = end_turn(comp, domain.turn_end(comp.text), ep.tokenizer)
            action = domain.parse_action(comp.text)
            turn = ep.add_turn(
                agent.writer, comp.ids, comp.text, comp.truncated, action, source_tokens, seam_ok
            )
            turn.stopped = comp is not written or (isinstance(comp, BridgedCompletion) and comp.stopped)


def end_turn(comp: Completion, end: int | None, tokenizer: PreTrainedTokenizerBase | None) -> Completion:
    """`comp` ended where its domain says the turn ends (`EpisodicDomain.turn_end`, None: as it
    is): the fewest of its ids whose text reaches `end`, then an EOS, as a stop string ends a
    generation. What the writer wrote after that never enters the episode; the EOS is the
    writer's (a trainer's mask 1), so a loss teaches ending the turn there."""
    if end is None:
        return comp
    if tokenizer is None or not comp.ids:
        return Completion(ids=[], text=comp.text[:end], truncated=False)
    head = comp.text[:end]

    def text(k: int) -> str:
        return str(tokenizer.decode(comp.ids[:k], skip_special_tokens=True))

    # A longer prefix of the ids decodes to a longer text: bisect for the fewest that reach the
    # cut (a few decodes, not one per token of a long turn).
    low, high = 1, len(comp.ids)
    if not text(high).startswith(head):
        return comp  # no prefix of the ids decodes to the turn's text (cannot happen with its own ids)
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if text(mid).startswith(head) else (mid + 1, high)
    return Completion(ids=[*comp.ids[:low], int(tokenizer.eos_token_id)], text=text(low), truncated=False)


def _step(
    domain: EpisodicDomain,
    envs: EnvSlots,
    table: _Table,
    limit: TurnBudget,
    on_turn: Callable[[Episode], None] | None,
    max_tokens: int | None = None,
) -> None:
    """Send every parsed action to its environment; record the observations; end episodes."""
    requests: list[tuple[int, str]] = []
    for slot, (position, ep) in list(table.active.items()):
        if on_turn is not None:
            on_turn(ep)
        turn = ep.turns[-1]
        last_turn = len(ep.turns) >= _budget(limit, ep)
        if turn.action is None:
            ep.invalid(domain.script, last=last_turn)
            if last_turn or _spent(ep, max_tokens):
                table.finish(slot, position, ep)
            continue
        requests.append((slot, turn.action))
    if not requests:
        return
    start = time.perf_counter()
    replies: list[EnvReply | Exception] = envs.step_many(requests)
    seconds = time.perf_counter() - start
    for (slot, _), reply in zip(requests, replies, strict=True):
        position, ep = table.active[slot]
        ep.env_seconds += seconds
        if isinstance(reply, Exception):
            ep.error = f"turn {len(ep.turns)} ({ep.turns[-1].action!r}): {reply}"
            table.finish(slot, position, ep)
            continue
        ep.score, ep.moves = reply.score, reply.moves
        ep.turns[-1].score = ep.score
        ep.done = reply.done
        last = ep.done or len(ep.turns) >= _budget(limit, ep)
        ep.add_observation(reply.observation, last=last, valid=reply.valid)
        if last or _spent(ep, max_tokens):
            table.finish(slot, position, ep)


def _budget(limit: TurnBudget, ep: Episode) -> int:
    return limit(ep) if callable(limit) else limit


def _spent(ep: Episode, max_tokens: int | None) -> bool:
    return max_tokens is not None and len(ep.ids) >= max_tokens
