"""The embedded agents of episodic domains: tiny models trained on recorded gold episodes.

Each training row is one whole gold episode (the same token sequence a live episode has, e.g.
SciWorld's AgentGym format), with CE on the gold turns, or on every token
(`episode_loss="all"`, the sciworld teacher: the observations' echoes of each action are copying
practice). The teacher is trained on all training items; the student (a smaller recipe with
`data_items`) on a small slice, so it starts weak. OPSD's student (`privileged_share`) also reads
gold episodes whose first user message carries the task's privileged context (the gold plan) in
OPSD's template, the view its teacher gets. The built model is scored by playing its domain's
eval items (the plain view).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distill.config import OPSD_TEMPLATE
from distill.episodes.data import IGNORE, SLIP, episode_example, replay_gold
from distill.episodes.episode import frame_for
from distill.episodes.protocol import as_episodic

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.domains.base import Domain, Item
    from distill.episodes.episode import Episode
    from distill.episodes.protocol import EpisodicDomain
    from distill.zoo.recipes import ModelRecipe


def agent_examples(
    domain: Domain, name: str, recipe: ModelRecipe, tokenizer: PreTrainedTokenizerBase
) -> tuple[list[tuple[list[int], list[int]]], int, dict[str, Any]]:
    """(training rows, batch size, figures for zoo.json) of an episodic domain's zoo agent."""
    episodic = as_episodic(domain)
    gold = [i for i in domain.train_items() if i.meta.get("steps")]
    items = gold
    if recipe.data_items is not None:
        # The student's warm start is a slice; episode sets are small (a few hundred), so the
        # slice is also at most an eighth of them, or the student would not start weak.
        items = gold[: min(recipe.data_items, max(1, len(gold) // 8))]
    if not items:
        raise ValueError(f"zoo {name}: no {domain.name} training item has a gold trajectory")
    examples = training_examples(
        items, episodic, tokenizer, recipe.episode_loss, recipe.corrupt_prob, recipe.seed
    )
    extra: dict[str, Any] = {"train_episodes": len(examples)}
    if recipe.detour_share:
        from distill.zoo.detours import detour_episodes

        detours = detour_episodes(items, episodic, tokenizer, recipe.detour_share, recipe.seed)
        examples += [_labelled(ep, recipe.episode_loss) for ep in detours]
        extra["detour_episodes"] = len(detours)
    if recipe.privileged_share:
        # The plan-reading view over many episodes (`privileged_items`), as on single-turn
        # domains: a skill learnt across tasks, not the plain slice memorised twice.
        pool = items if recipe.privileged_items is None else gold[: recipe.privileged_items]
        privileged = privileged_examples(
            pool,
            domain,
            tokenizer,
            recipe.episode_loss,
            recipe.privileged_share,
            recipe.seed,
            recipe.privileged_every_turn,
        )
        examples += privileged
        extra["privileged_episodes"] = len(privileged)
    lengths = [len(ids) for ids, _ in examples]
    extra["episode_tokens_mean"] = round(sum(lengths) / len(lengths), 1)
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

    if loss not in ("turns", "all"):
        raise ValueError(f"episode_loss={loss!r}: expected 'turns' or 'all'")
    frame = frame_for(tokenizer, None)
    rng = random.Random(seed)
    out = []
    for item in items:
        slip = None
        if corrupt_prob and rng.random() < corrupt_prob:
            slip = (rng.randrange(len(item.meta["steps"])), rng.randint(1, 6))
        out.append(_labelled(replay_gold(item, domain, tokenizer, frame, slip=slip), loss))
    return out


def _labelled(ep: Episode, loss: str) -> tuple[list[int], list[int]]:
    """A gold episode's (ids, labels): the gold turns ("turns"), or every token but a slip's."""
    if loss == "turns":
        return episode_example(ep, ["gold"])
    slipped = ep.mask({SLIP})
    return list(ep.ids), [IGNORE if m else t for t, m in zip(ep.ids, slipped, strict=True)]


def privileged_examples(
    items: list[Item],
    domain: Domain,
    tokenizer: PreTrainedTokenizerBase,
    loss: str,
    share: float,
    seed: int = 0,
    every_turn: bool = False,
) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of that `share` of the items' gold episodes in OPSD's privileged view:
    the first user message rewritten by OPSD's template around the task's privileged context
    (SciWorld: the gold plan), every later token and label the plain episode's. The rewritten
    start is never labelled: the model learns to act on the plan, not to write one. `every_turn`:
    the context ends every user message instead (OPSD's `method.privileged_every_turn`), the
    inserted tokens never labelled."""
    import random

    frame = frame_for(tokenizer, None)
    rng = random.Random(f"privileged:{seed}")  # its own stream: the plain examples stay as they were
    out = []
    for item in [i for i in items if rng.random() < share]:
        ep = replay_gold(item, as_episodic(domain), tokenizer, frame)
        ids, labels = _labelled(ep, loss)
        if every_turn:
            view, where = ep.privileged_view(domain.privileged_context(item))
            view_labels = [IGNORE] * len(view)
            for at, label in zip(where, labels, strict=True):
                view_labels[at] = label
            out.append((view, view_labels))
        else:
            message = domain.privileged_message(OPSD_TEMPLATE, item, ep.first_message)
            start, end = ep.privileged_prompt(message)
            out.append((start + ids[end:], [IGNORE] * len(start) + labels[end:]))
    return out
