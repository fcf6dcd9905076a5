"""Multi-turn training data from episodes: one token sequence per episode, CE on chosen writers.

An `Episode` (distill/domains/sciworld/episode.py) is the exact token sequence the model saw,
with every assistant turn tagged by its writer. Training rows keep the sequence and put labels
only on the turns of the writers being imitated (teacher turns for ROSE and teacher-SFT, gold
turns for the embedded teacher); environment text, template tokens and the fixed first reply
are never labelled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.config import SFTMethod
    from distill.domains.base import Item
    from distill.domains.sciworld import SciWorldDomain
    from distill.domains.sciworld.episode import ChatFrame, Episode
    from distill.domains.sciworld.play import EngineAgent
    from distill.engines.hf import Completion
    from distill.methods.context import RunContext

IGNORE = -100
# The writer of the malformed turns `replay_gold` can insert (never a training target).
SLIP = "slip"


def episode_example(ep: Episode, writers: Iterable[str]) -> tuple[list[int], list[int]]:
    """(input_ids, labels): labels are the ids on the writers' turns, -100 elsewhere."""
    mask = ep.mask(frozenset(writers))
    if len(mask) != len(ep.ids):
        raise ValueError(f"episode {ep.item.id}: {len(ep.ids)} ids but {len(mask)} mask entries")
    return list(ep.ids), [tok if m else IGNORE for tok, m in zip(ep.ids, mask, strict=True)]


def replay_gold(
    item: Item,
    tokenizer: PreTrainedTokenizerBase,
    frame: ChatFrame,
    writer: str = "gold",
    slip: tuple[int, int] | None = None,
) -> Episode:
    """An item's recorded gold trajectory as an episode token sequence, without a simulator.

    The steps (action, observation) were played through the simulator when the item was made;
    the sequence is built by the same code that builds a live episode. `slip=(turn, words)`
    puts a malformed turn (writer `SLIP`) before gold turn `turn`: that turn's thought cut
    after `words` words, with no `Action:` line, answered by the "Invalid Action" feedback a
    live episode gets. It needs no simulator (no step is taken) and the gold play goes on.
    """
    from distill.domains.sciworld.episode import Episode
    from distill.domains.sciworld.prompt import format_response

    steps = item.meta.get("steps")
    if not steps:
        raise ValueError(f"item {item.id} carries no gold steps")
    ep = Episode(item=item, worker=-1, tokenizer=tokenizer, frame=frame)
    ep.begin(str(item.meta["first"]))

    def ended(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]

    for i, step in enumerate(steps):
        text = format_response(step["action"])
        if slip is not None and slip[0] == i:
            thought = text.split("\n\nAction:")[0].split(" ")
            cut = " ".join(thought[: max(1, min(slip[1], len(thought)))])
            ep.add_turn(SLIP, ended(cut), cut, truncated=False)
            ep.invalid(last=False)
        ep.add_turn(writer, ended(text), text, truncated=False)
        ep.add_observation(step["observation"], last=i + 1 == len(steps))
    ep.score = int(item.meta.get("gold_score", 0))
    ep.done = True
    return ep


def episode_stats(episodes: list[Episode]) -> dict[str, float]:
    """The `env/` figures of DESIGN.md for a batch of episodes."""
    from distill.domains.sciworld.episode import reward_of

    if not episodes:
        return {}
    n = len(episodes)
    turns = [t for ep in episodes for t in ep.turns]
    return {
        "env/turns_mean": sum(len(ep.turns) for ep in episodes) / n,
        "env/student_turns_mean": sum(ep.count("student") for ep in episodes) / n,
        "env/teacher_turns_mean": sum(ep.count("teacher") for ep in episodes) / n,
        "env/invalid_action_rate": sum(not t.valid for t in turns) / max(len(turns), 1),
        "env/score_mean": sum(0.0 if ep.failed else reward_of(ep.score) for ep in episodes) / n,
        "env/success_rate": sum((not ep.failed) and ep.score >= 100 for ep in episodes) / n,
        "env/step_time_s": sum(ep.env_seconds for ep in episodes) / max(len(turns), 1),
        "env/failed_episodes": float(sum(ep.failed for ep in episodes)),
    }


def teacher_turn_stats(episodes: list[Episode], budget: int, writer: str = "teacher") -> dict[str, Any]:
    """ce_target tokens and truncation of the teacher's turns (per turn), as DESIGN names them."""
    lengths = [t.tokens for ep in episodes for t in ep.turns if t.writer == writer]
    truncated = [t.truncated for ep in episodes for t in ep.turns if t.writer == writer]
    if not lengths:
        return {}
    mean = sum(lengths) / len(lengths)
    return {
        "teacher/ce_target_tokens_mean": mean,
        "teacher/ce_target_tokens_max": float(max(lengths)),
        "teacher/ce_target_share": mean / budget,
        "teacher/truncation_rate": sum(truncated) / len(truncated),
    }


def retokenize(
    ep: Episode, tokenizer: PreTrainedTokenizerBase, frame: ChatFrame, ongoing: bool = False
) -> Episode:
    """The same episode in another tokenizer's tokens, turn by turn (cross-family data).

    Each turn's text is re-encoded on its own, so turn boundaries and writers carry over; a turn
    that ended with EOS ends with the new tokenizer's EOS. `ongoing`: the episode is still being
    played, so its last observation is encoded too, ready for the next turn.
    """
    from distill.domains.sciworld.episode import Episode

    out = Episode(item=ep.item, worker=ep.worker, tokenizer=tokenizer, frame=frame)
    out.begin(ep.first_observation)
    for i, turn in enumerate(ep.turns):
        new = out.add_turn(
            turn.writer, turn_ids(tokenizer, turn.response, turn.truncated), turn.response, turn.truncated
        )
        out.add_observation(turn.observation, last=not ongoing and i + 1 == len(ep.turns))
        new.valid, new.score = turn.valid, turn.score
    out.score, out.done, out.error, out.moves = ep.score, ep.done, ep.error, ep.moves
    return out


def turn_ids(tokenizer: PreTrainedTokenizerBase, text: str, truncated: bool) -> list[int]:
    """A turn's text in `tokenizer`'s ids, ending with its EOS unless the turn was cut off."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids if truncated else [*ids, tokenizer.eos_token_id]


class BridgedAgent:
    """A model of another tokenizer family writing turns of episodes held in the student's
    tokens (cross-family ROSE): it reads each episode re-encoded turn by turn in its own
    tokens and its turn's text comes back re-encoded in the episode's tokens."""

    def __init__(self, agent: EngineAgent) -> None:
        from distill.evals.agent import frame_for

        self.agent = agent
        self.writer = agent.writer
        engine = agent.engine
        self.tokenizer = engine.tokenizer
        self.frame = frame_for(engine.tokenizer, engine.enable_thinking)

    def act(self, episodes: Sequence[Episode], max_new_tokens: int) -> list[Completion]:
        from distill.engines.hf import Completion

        views = []
        for ep in episodes:
            view = retokenize(ep, self.tokenizer, self.frame, ongoing=True)
            # The view of turn t+1 extends the view of turn t: the agent's KV cache carries over.
            view.uid = ep.uid
            views.append(view)
        out = []
        for ep, comp in zip(episodes, self.agent.act(views, max_new_tokens), strict=True):
            assert ep.tokenizer is not None
            ids = turn_ids(ep.tokenizer, comp.text, comp.truncated)
            out.append(Completion(ids=ids, text=comp.text, truncated=comp.truncated))
        return out


def teacher_episodes(ctx: RunContext) -> list[dict[str, Any]]:
    """teacher-SFT data: the teacher plays the training items; rows saved in `data/`."""
    import json
    import math

    from distill.domains.sciworld.play import EngineAgent, PlayConfig, play, single
    from distill.evals.agent import frame_for
    from distill.progress import progress_bar

    cfg = ctx.config
    method: SFTMethod = cfg.method  # type: ignore[assignment]
    domain: SciWorldDomain = ctx.domain  # type: ignore[assignment]
    path = ctx.run_dir / "data" / "teacher_episodes.jsonl"
    if path.exists():  # resumed run: the same data, not a fresh draw
        return [json.loads(line) for line in path.read_text().splitlines()]
    needed = math.ceil(cfg.optim.max_steps * cfg.optim.batch_size * cfg.optim.grad_accum / method.epochs)
    items = domain.train_items()
    items = items[: min(len(items), math.ceil(needed / method.samples_per_prompt))]
    items = [item for item in items for _ in range(method.samples_per_prompt)]
    teacher = ctx.teacher
    agent = EngineAgent(teacher, "teacher", method.temperature, cfg.rollout.top_p, cfg.eval.batch_size)
    dcfg = domain.config
    play_cfg = PlayConfig(max_turns=dcfg.max_turns, turn_max_new_tokens=dcfg.turn_max_new_tokens)
    with progress_bar("teacher episodes", total=len(items)) as advance:
        episodes = play(
            domain.pool(),
            items,
            single(agent),
            teacher.tokenizer,
            frame_for(teacher.tokenizer, teacher.enable_thinking),
            play_cfg,
            progress=advance,
        )
    student = ctx.student
    same = student.tokenizer.get_vocab() == teacher.tokenizer.get_vocab()
    frame = frame_for(student.tokenizer, student.enable_thinking)
    rows = []
    for ep in episodes:
        if ep.failed:
            continue
        seq = ep if same else retokenize(ep, student.tokenizer, frame)
        ids, labels = episode_example(seq, ["teacher"])
        rows.append({**ep.record(dcfg.negative_score), "input_ids": ids, "labels": labels})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    ctx.log.write(0, {**episode_stats(episodes), **teacher_turn_stats(episodes, dcfg.turn_max_new_tokens)})
    return rows


def train_sft(ctx: RunContext) -> None:
    """Multi-turn teacher-SFT: CE on the teacher's turns of its own (successful) episodes."""
    from datasets import Dataset
    from trl import SFTConfig

    from distill.methods.callbacks import trainer_common_args
    from distill.methods.sft import fit_sft

    cfg = ctx.config
    method: SFTMethod = cfg.method  # type: ignore[assignment]
    rows = teacher_episodes(ctx)
    kept = [r for r in rows if r["success"]] if method.keep_verified_only else rows
    if not kept:
        raise ValueError(
            "sft: no teacher episode reached score 100; the teacher cannot solve these tasks "
            "(set method.keep_verified_only=false to train on them anyway)"
        )
    ctx.log.write(0, {"teacher/kept_trajectories": float(len(kept))})
    dataset = Dataset.from_list([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in kept])
    args = SFTConfig(
        **trainer_common_args(ctx),
        per_device_train_batch_size=min(cfg.optim.batch_size, len(kept)),
        packing=False,
        max_length=None,
        dataset_num_proc=None,
    )

    fit_sft(ctx, args, dataset)
