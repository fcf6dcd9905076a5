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
    examples = training_examples(items, tokenizer, recipe.episode_loss)
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
        "eval": {k: round(v, 4) for k, v in result.metrics.items() if not k.startswith("task/")},
    }


def training_examples(
    items: list[Item], tokenizer: PreTrainedTokenizerBase, loss: str
) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of the items' gold episodes: labels on the gold turns ("turns") or on
    every token ("all", observations and template too)."""
    from distill.evals.agent import frame_for
    from distill.methods.episodes import gold_examples

    examples = gold_examples(items, tokenizer, frame_for(tokenizer, None))
    if loss == "all":
        return [(ids, list(ids)) for ids, _ in examples]
    if loss != "turns":
        raise ValueError(f"episode_loss={loss!r}: expected 'turns' or 'all'")
    return examples
