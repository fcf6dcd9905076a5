"""The embedded agents of episodic domains: tiny models trained on recorded gold episodes.

Each training row is one whole gold episode (the same token sequence a live episode has, e.g.
SciWorld's AgentGym format), with CE on the gold turns, or on every token
(`episode_loss="all"`, the sciworld teacher: the observations' echoes of each action are copying
practice). The teacher is trained on all training items; the student (a smaller recipe with
`data_items`) on a small slice, so it starts weak. The built model is scored by playing its
domain's eval items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.domains.base import Domain, Item
    from distill.episodes.protocol import EpisodicDomain
    from distill.zoo.recipes import ModelRecipe


def agent_examples(
    domain: Domain, name: str, recipe: ModelRecipe, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[tuple[list[int], list[int]]], int, dict[str, Any]]:
    """(training rows, batch size, figures for zoo.json) of an episodic domain's zoo agent."""
    from distill.episodes.protocol import as_episodic

    episodic = as_episodic(domain)
    items = [i for i in domain.train_items() if i.meta.get("steps")]
    if recipe.data_items is not None:
        # The student's warm start is a slice; episode sets are small (a few hundred), so the
        # slice is also at most an eighth of them, or the student would not start weak.
        items = items[: min(recipe.data_items, max(1, len(items) // 8))]
    if not items:
        raise ValueError(f"zoo {name}: no {domain.name} training item has a gold trajectory")
    examples = training_examples(
        items, episodic, tokenizer, recipe.episode_loss, recipe.corrupt_prob, recipe.seed
    )
    lengths = [len(ids) for ids, _ in examples]
    extra = {"train_episodes": len(examples), "episode_tokens_mean": round(sum(lengths) / len(lengths), 1)}
    # Episodes are long (~1-2k tokens): batches of a few episodes, same number of updates.
    return examples, max(1, min(recipe.batch_size, 8)), extra


def training_examples(
    items: list[Item],
    domain: EpisodicDomain,
    tokenizer: PreTrainedTokenizerBase,
    loss: str,
    corrupt_prob: float = 0.0,
    seed: int = 0,
) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of the items' gold episodes: labels on the gold turns ("turns") or on
    every token ("all", observations and template too).

    With `corrupt_prob`, that share of episodes carries one malformed turn (a thought cut short,
    no action) and the domain's invalid-action feedback before a gold turn, never labelled: a
    model trained on flawless episodes only has never read that feedback, and writes nonsense
    after it, which is what a student's own episodes are full of (docs/sciworld.md).
    """
    import random

    from distill.episodes.data import IGNORE, SLIP, episode_example, replay_gold
    from distill.episodes.episode import frame_for

    if loss not in ("turns", "all"):
        raise ValueError(f"episode_loss={loss!r}: expected 'turns' or 'all'")
    frame = frame_for(tokenizer, None)
    rng = random.Random(seed)
    out = []
    for item in items:
        slip = None
        if corrupt_prob and rng.random() < corrupt_prob:
            slip = (rng.randrange(len(item.meta["steps"])), rng.randint(1, 6))
        ep = replay_gold(item, domain, tokenizer, frame, slip=slip)
        if loss == "turns":
            out.append(episode_example(ep, ["gold"]))
        else:
            slipped = ep.mask({SLIP})
            out.append((list(ep.ids), [IGNORE if m else t for t, m in zip(ep.ids, slipped, strict=True)]))
    return out
