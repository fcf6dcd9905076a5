"""A run over several single-turn domains (`rlve+dapo`): one prompt stream drawn from each part by
its weight, every item tagged with its part, so scoring, the teacher and the eval each go to the
item's own domain.

The training items are the parts' own (each cached as in a one-domain run), each part's share of
`domain.train_size` in proportion to `domain.mix`, interleaved in a seeded order. A share larger
than the part's items takes them all and goes round again: the weights hold, and no part is cut to
fewer distinct prompts than its own run trains on when the total leaves room for all of them. The eval items are each part's, concatenated (the run evaluates each part on its
own, `parts()`).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import TYPE_CHECKING

from distill.domains import build_domain
from distill.domains.base import Domain, Item, Score, cached_items
from distill.domains.mixed.config import MixConfig

if TYPE_CHECKING:
    from distill.config import DomainBase

# The item's domain, in `Item.meta`.
PART = "domain"


def part_of(item: Item) -> str:
    """The domain a mixed run's item came from."""
    part = item.meta.get(PART)
    if not isinstance(part, str):
        raise ValueError(f"item {item.id} carries no domain (not from a mixed run)")
    return part


def tagged(items: list[Item], part: str) -> list[Item]:
    return [replace(item, meta={**item.meta, PART: part}) for item in items]


def draw(parts: dict[str, list[Item]], weights: dict[str, float], total: int) -> list[Item]:
    """`total` items, each part's share by its weight (its first items; past its last, from its
    first again), in one fixed order (the trainer shuffles them again, by the run's seed)."""
    out: list[Item] = []
    for name, share in shares(weights, total).items():
        items = parts[name]
        out += [items[i % len(items)] for i in range(share)] if items else []
    random.Random("+".join(parts)).shuffle(out)
    return out


def shares(weights: dict[str, float], total: int) -> dict[str, int]:
    """`total` split by `weights` (summing to 1) into whole counts that add up to it: each its
    floor, the rest one each to the largest remainders (first part first on a tie)."""
    exact = {name: w * total for name, w in weights.items()}
    out = {name: int(x) for name, x in exact.items()}
    rest = sorted(exact, key=lambda n: -(exact[n] - out[n]))[: total - sum(out.values())]
    return {name: n + (name in rest) for name, n in out.items()}


def step_plan(weights: dict[str, float], steps: int) -> list[str]:
    """The domain each step trains with `domain.alternate`: each domain's steps in proportion to
    its weight, spread evenly (every step goes to the domain furthest behind its share, the first
    on a tie), so the run has trained each about its share at any step, and the schedule's lr
    falls on every domain alike."""
    done = dict.fromkeys(weights, 0)
    plan: list[str] = []
    for step in range(1, steps + 1):
        part = max(weights, key=lambda name: weights[name] * step - done[name])
        done[part] += 1
        plan.append(part)
    return plan


def alternating_order(items: list[Item], plan: list[str], block: int, seed: int) -> list[int]:
    """Indices into `items` for `plan`'s steps, `block` prompts a step, each step's all from its
    own domain: each domain's items in an order shuffled by `seed`, taken in turn (past its last,
    round again in a new order)."""
    by_part: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        by_part.setdefault(part_of(item), []).append(i)
    rng = random.Random(seed)
    queued: dict[str, list[int]] = {name: [] for name in by_part}
    out: list[int] = []
    for part in plan:
        if part not in by_part:
            raise ValueError(f"the mix has no training items of {part}")
        queue = queued[part]
        while len(queue) < block:
            more = list(by_part[part])
            rng.shuffle(more)
            queue += more
        out += queue[:block]
        del queue[:block]
    return out


class MixedDomain(Domain):
    """The parts, each a domain of its own, behind one `Domain`."""

    def __init__(self, config: MixConfig, parts: dict[str, Domain]) -> None:
        self.config = config
        self.name = config.name
        self.domains = parts

    def parts(self) -> dict[str, Domain]:
        return dict(self.domains)

    def train_items(self) -> list[Item]:
        def make() -> list[Item]:
            items = {name: tagged(d.train_items(), name) for name, d in self.domains.items()}
            return draw(items, self.config.weights(), self.config.train_size)

        return cached_items(self.config, "train", make)

    def eval_items(self) -> list[Item]:
        return [item for name, d in self.domains.items() for item in tagged(d.eval_items(), name)]

    def score(self, item: Item, response: str) -> Score:
        return self.domains[part_of(item)].score(item, response)

    def score_batch(self, items: list[Item], responses: list[str]) -> list[Score]:
        """Each part scores its own rows, in one batch each (a part may grade in worker processes)."""
        if len(items) != len(responses):
            raise ValueError(f"score_batch: {len(items)} items but {len(responses)} responses")
        out: list[Score | None] = [None] * len(items)
        for name, domain in self.domains.items():
            rows = [i for i, item in enumerate(items) if part_of(item) == name]
            if rows:
                scores = domain.score_batch([items[i] for i in rows], [responses[i] for i in rows])
                for i, score in zip(rows, scores, strict=True):
                    out[i] = score
        return [s for s in out if s is not None]

    def solution_segments(self, item: Item, rng: random.Random | None = None) -> list[tuple[str, bool]]:
        return self.domains[part_of(item)].solution_segments(item, rng)

    def privileged_context(self, item: Item) -> str:
        return self.domains[part_of(item)].privileged_context(item)

    def corpus(self) -> list[str]:
        return [text for domain in self.domains.values() for text in domain.corpus()]

    def close(self) -> None:
        for domain in self.domains.values():
            domain.close()


def build(config: DomainBase) -> MixedDomain:
    if not isinstance(config, MixConfig):
        raise TypeError(f"the mixed domain takes a MixConfig, not {type(config).__name__}")
    parts: dict[str, Domain] = {}
    try:
        for name, part in config.parts.items():
            parts[name] = build_domain(part)
    except BaseException:
        for domain in parts.values():
            domain.close()
        raise
    return MixedDomain(config, parts)
