"""`student/duplicate_share`: the share of a step's sampled responses identical to another sample
of the same prompt, as the on-policy step logs it (methods/batch.py log_rollouts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from distill.config import Sampling, resolve_config
from distill.domains import build_domain
from distill.engines.base import right_pad
from distill.engines.hf import HFEngine
from distill.methods.batch import Batches, TeacherSide, duplicate_share
from distill.methods.context import RunContext
from distill.methods.views import plain_prompt
from distill.tracking.base import NullTracker
from distill.tracking.rundir import RunDir
from distill.tracking.steplog import SilentLog


def test_a_response_counts_only_against_samples_of_its_own_prompt() -> None:
    prompts = [[1, 2], [1, 2], [1, 2], [3]]
    # Prompt [1, 2]: two of its three samples are one response, the second copy a repeat; prompt
    # [3]'s sample is the same ids as theirs, but of another prompt: no repeat.
    assert duplicate_share(prompts, [[5, 6], [5, 6], [7], [5, 6]]) == 0.25
    assert duplicate_share(prompts, [[5, 6], [5, 6], [5, 6], [5, 6]]) == 0.5
    assert duplicate_share(prompts, [[5], [6], [7], [8]]) == 0.0


def _logged_share(tiny_zoo: Any, tmp_path: Path, temperature: float, n: int) -> tuple[float, list[list[int]]]:
    """One OPD step's rollouts of 3 prompts x n samples drawn by the tiny zoo student at
    `temperature`, through the step's own path (rollouts -> teacher scores -> targets)."""
    config = resolve_config(
        "rlve",
        "opd",
        None,
        [
            f"student.name={tiny_zoo.student}",
            f"teacher.name={tiny_zoo.teacher}",
            "domain.train_size=16",
            "preflight=false",
        ],
    )
    student, teacher = HFEngine.load(str(tiny_zoo.student)), HFEngine.load(str(tiny_zoo.teacher))
    ctx = RunContext(
        config, RunDir(tmp_path), build_domain(config.domain), student, teacher, SilentLog(NullTracker())
    )
    ctx.items = ctx.domain.train_items()
    indices = [i for i in range(3) for _ in range(n)]  # GRPO's layout: a prompt's samples side by side
    prompts = [student.prompt_ids(ctx.items[i].prompt) for i in indices]
    completions = [c.ids for c in student.generate(prompts, Sampling(12, temperature=temperature))]
    # GRPO's output layout: prompts left-padded, completions right-padded, each with its mask.
    pad = int(student.tokenizer.pad_token_id)
    out = dict(zip(("prompt_ids", "prompt_mask"), student.left_pad(prompts), strict=True))
    out.update(zip(("completion_ids", "completion_mask"), right_pad(completions, pad), strict=True))
    batches = Batches(ctx, {"rlve": TeacherSide(teacher, plain_prompt)})
    batch = batches.rollouts([{"item_index": i} for i in indices], out, 0.0, 0.0)
    batches.targets(1, batch, batches.score({"rlve": teacher}, batch), {})
    return ctx.log.pending["student/duplicate_share"], completions  # type: ignore[attr-defined]


def _count(completions: list[list[int]], n: int) -> float:
    """The same share counted the long way: each sample against the earlier ones of its prompt."""
    groups = [completions[i : i + n] for i in range(0, len(completions), n)]
    repeats = sum(any(g[j] == g[i] for j in range(i)) for g in groups for i in range(n))
    return repeats / len(completions)


@pytest.mark.integration
def test_the_logged_share_is_what_the_sampled_batch_holds(tiny_zoo: Any, tmp_path: Path) -> None:
    # Near-greedy, 4 samples a prompt: each prompt's 4 samples are one response, 3 of them repeats.
    greedy, sampled = _logged_share(tiny_zoo, tmp_path / "a", 0.01, 4)
    assert greedy == _count(sampled, 4) == 0.75
    # Hot sampling of the same prompts: the share the batch holds, below the near-greedy one.
    hot, sampled = _logged_share(tiny_zoo, tmp_path / "b", 2.0, 4)
    assert hot == _count(sampled, 4) < 0.75
