"""Teacher-SFT on an episodic domain: the teacher plays the training items, the student is
fine-tuned with CE on the teacher's turns of its own (successful) episodes.

Episodes are played in the teacher's tokens and cross the tokenizer bridge turn by turn for a
student of another tokenizer family (an episode that does not cross losslessly is dropped and
counted in `teacher/seam_failure_rate`); environment text, template tokens and a fixed first
reply are never labelled.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from distill.config import SFTMethod
from distill.episodes.data import IGNORE, episode_example, episode_stats, retokenize
from distill.episodes.episode import frame_for
from distill.episodes.play import EngineAgent, play, single
from distill.episodes.protocol import as_episodic
from distill.methods.budget import teacher_turns
from distill.methods.callbacks import trainer_common_args
from distill.methods.sft import fit_sft
from distill.progress import progress_bar
from distill.tokenizer_bridge.bridge import TokenizerBridge

if TYPE_CHECKING:
    from distill.methods.context import RunContext


def teacher_episodes(ctx: RunContext) -> list[dict[str, Any]]:
    """teacher-SFT data: the teacher plays the training items; rows saved in `data/`."""
    cfg = ctx.config
    method = ctx.method_as(SFTMethod)
    domain = as_episodic(ctx.domain)
    path = ctx.run.data / "teacher_episodes.jsonl"
    if path.exists():  # resumed run: the same data, not a fresh draw
        return [json.loads(line) for line in path.read_text().splitlines()]
    needed = math.ceil(cfg.optim.max_steps * cfg.optim.batch_size * cfg.optim.grad_accum / method.epochs)
    items = ctx.domain.train_items()
    items = items[: min(len(items), math.ceil(needed / method.samples_per_prompt))]
    items = [item for item in items for _ in range(method.samples_per_prompt)]
    teacher = ctx.teacher
    sampling = cfg.teacher_sampling()
    agent = EngineAgent(teacher, "teacher", sampling, cfg.eval.batch_size)
    with progress_bar("teacher episodes", total=len(items)) as advance:
        episodes = play(
            domain,
            items,
            single(agent),
            teacher.tokenizer,
            frame_for(teacher.tokenizer, teacher.enable_thinking),
            progress=advance,
        )
    student = ctx.student
    bridge = TokenizerBridge(student.tokenizer, teacher.tokenizer)
    frame = frame_for(student.tokenizer, student.enable_thinking)
    rows = []
    seams: list[bool] = []
    for ep in episodes:
        if ep.failed:
            continue
        if not bridge.same:
            # Turn by turn through the bridge; an episode that crossed lossily is not trained on.
            ep = retokenize(ep, bridge, frame, domain.script, to_teacher=False)
            seams.append(ep.seam_ok)
            if not ep.seam_ok:
                continue
        ids, labels = episode_example(ep, ["teacher"], method.valid_turns_only)
        rows.append({**ep.record(domain), "input_ids": ids, "labels": labels})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    seam = {"teacher/seam_failure_rate": 1 - sum(seams) / len(seams)} if seams else {}
    ctx.log.write(
        0, {**episode_stats(episodes, domain), **teacher_turns(episodes, sampling.max_new_tokens), **seam}
    )
    return rows


def train(ctx: RunContext) -> None:
    """Multi-turn teacher-SFT: CE on the teacher's turns of its own (successful) episodes."""
    from datasets import Dataset
    from trl import SFTConfig

    cfg = ctx.config
    method = ctx.method_as(SFTMethod)
    rows = teacher_episodes(ctx)
    kept = [r for r in rows if r["success"]] if method.keep_verified_only else rows
    if not kept:
        raise ValueError(
            "sft: no teacher episode solved its task; the teacher cannot solve these tasks "
            "(set method.keep_verified_only=false to train on them anyway)"
        )
    # An episode none of whose teacher turns is labelled (`valid_turns_only`: none accepted)
    # teaches nothing, and a batch of such rows has a loss over no tokens (NaN).
    kept = [r for r in kept if any(label != IGNORE for label in r["labels"])]
    if not kept:
        raise ValueError(
            "sft: the environment accepted no action of the teacher in the kept episodes "
            "(method.valid_turns_only labels only accepted turns)"
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
