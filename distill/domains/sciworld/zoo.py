"""The embedded SciWorld agents: tiny models trained on the simulator's gold episodes.

Each training row is one whole gold episode in the AgentGym format (the same token sequence a
live episode has), with CE on the gold turns, or on every token (`episode_loss="all"`, the
sciworld teacher: the observations' echoes of each action are copying practice). The teacher
is trained on all training items; the student (a smaller recipe with `data_items`) on a small
slice, so it starts weak. The built model is scored by playing its domain's eval items on the
simulator pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.domains.base import Item
    from distill.domains.sciworld import SciWorldDomain
    from distill.zoo.recipes import ModelRecipe


def build_agent(
    domain: SciWorldDomain,
    name: str,
    recipe: ModelRecipe,
    tok_dir: Path,
    out: Path,
    show_progress: bool,
) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from distill.engines.hf import HFEngine
    from distill.evals.agent import AgentEvalConfig, evaluate_agent
    from distill.zoo.build import _make_model, fit_examples, save_model

    torch.manual_seed(recipe.seed)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    model = _make_model(recipe, tokenizer)
    items = [i for i in domain.train_items() if i.meta.get("steps")]
    if recipe.data_items is not None:
        # The student's warm start is a slice; episode sets are small (a few hundred), so the
        # slice is also at most an eighth of them, or the student would not start weak.
        items = items[: min(recipe.data_items, max(1, len(items) // 8))]
    if not items:
        raise ValueError(f"zoo {name}: no sciworld training item has a gold trajectory")
    examples = training_examples(items, tokenizer, recipe.episode_loss, recipe.corrupt_prob, recipe.seed)
    # Episodes are long (~1-2k tokens): batches of a few episodes, same number of updates.
    batch_size = max(1, min(recipe.batch_size, 8))
    loss_value = fit_examples(
        model, tokenizer, examples, recipe, batch_size, f"zoo: training {name} (sciworld)", show_progress
    )
    cfg = domain.config
    result = evaluate_agent(
        HFEngine(model, tokenizer),
        domain,
        domain.eval_items(),
        AgentEvalConfig(
            max_turns=cfg.max_turns,
            turn_max_new_tokens=cfg.turn_max_new_tokens,
            negative_score=cfg.negative_score,
        ),
        label=f"zoo: eval {name}",
        show_progress=show_progress,
    )
    save_model(model, tokenizer, out)
    lengths = [len(ids) for ids, _ in examples]
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss": round(loss_value, 4),
        "train_episodes": len(examples),
        "episode_tokens_mean": round(sum(lengths) / len(lengths), 1),
        # Per task too (`task/<id>/success`): a pair's mean can hide a task it never solves.
        "eval": {k: round(v, 4) for k, v in result.metrics.items()},
    }


def training_examples(
    items: list[Item],
    tokenizer: PreTrainedTokenizerBase,
    loss: str,
    corrupt_prob: float = 0.0,
    seed: int = 0,
) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of the items' gold episodes: labels on the gold turns ("turns") or on
    every token ("all", observations and template too).

    With `corrupt_prob`, that share of episodes carries one malformed turn (a thought cut short,
    no action) and the "Invalid Action" feedback before a gold turn, never labelled: a model
    trained on flawless episodes only has never read that feedback, and writes nonsense after
    it, which is what a student's own episodes are full of (docs/sciworld.md).
    """
    import random

    from distill.evals.agent import frame_for
    from distill.methods.episodes import IGNORE, SLIP, episode_example, replay_gold

    if loss not in ("turns", "all"):
        raise ValueError(f"episode_loss={loss!r}: expected 'turns' or 'all'")
    frame = frame_for(tokenizer, None)
    rng = random.Random(seed)
    out = []
    for item in items:
        slip = None
        if corrupt_prob and rng.random() < corrupt_prob:
            slip = (rng.randrange(len(item.meta["steps"])), rng.randint(1, 6))
        ep = replay_gold(item, tokenizer, frame, slip=slip)
        if loss == "turns":
            out.append(episode_example(ep, ["gold"]))
        else:
            slipped = ep.mask({SLIP})
            out.append((list(ep.ids), [IGNORE if m else t for t, m in zip(ep.ids, slipped, strict=True)]))
    return out
