"""What every domain provides: prompts, an eval set, worked solutions and a verifier."""

from __future__ import annotations

import json
import os
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from distill.settings import get_settings

if TYPE_CHECKING:
    from distill.config import DomainBase


@dataclass(frozen=True)
class Item:
    """One problem. `solution` is a worked response ending in the boxed answer, when known."""

    id: str
    prompt: str
    answer: str
    solution: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Score:
    reward: float
    correct: bool
    # The response carried an answer in the required format (e.g. a final \boxed{}).
    formatted: bool


class Domain(ABC):
    """A single-turn domain implements these; an episodic one (registry.py `episodic=True`) also
    implements `distill.episodes.protocol.EpisodicDomain`."""

    name: str

    @abstractmethod
    def train_items(self) -> list[Item]: ...

    @abstractmethod
    def eval_items(self) -> list[Item]: ...

    @abstractmethod
    def score(self, item: Item, response: str) -> Score: ...

    def score_batch(self, items: list[Item], responses: list[str]) -> list[Score]:
        if len(items) != len(responses):
            raise ValueError(f"score_batch: {len(items)} items but {len(responses)} responses")
        return [self.score(item, response) for item, response in zip(items, responses, strict=True)]

    def solution_segments(self, item: Item, rng: random.Random | None = None) -> list[tuple[str, bool]]:
        """The worked solution as (text, trainable) segments; with `rng`, a corrupted variant
        (a wrong intermediate step marked untrainable), where the domain offers one."""
        if item.solution is None:
            raise ValueError(f"item {item.id} has no worked solution")
        return [(item.solution, True)]

    def privileged_context(self, item: Item) -> str:
        """What an OPSD teacher may see beyond the problem: the worked solution, else the answer."""
        if item.solution:
            return item.solution
        return f"The final answer is \\boxed{{{item.answer}}}."

    def privileged_message(self, template: str, item: Item, problem: str | None = None) -> str:
        """A privileged teacher's user message: `template` (OPSD's `method.teacher_template`)
        around the problem (`problem`, default the item's prompt; an episode's first user message)
        and this item's privileged context."""
        shown = item.prompt if problem is None else problem
        return template.format(problem=shown.strip(), solution=self.privileged_context(item).strip())

    def benchmark_items(
        self, name: str, data: str | None, count: int, seed: int = 0
    ) -> tuple[list[Item], str]:
        """The items of benchmark `name` (registry.py) from `data` (a file or folder) or its
        default source, and a sentence saying where they came from."""
        raise ValueError(f"the {self.name} domain has no benchmark {name!r}")

    def close(self) -> None:
        """Release what the domain holds (worker processes, simulators); the runner always calls it."""
        return None  # most domains hold nothing

    def corpus(self) -> list[str]:
        """Texts a locally trained tokenizer should cover (prompts and solutions)."""
        texts: list[str] = []
        for item in self.train_items() + self.eval_items():
            texts.append(item.prompt)
            if item.solution:
                texts.append(item.solution)
        return texts


def cached_items(config: DomainBase, split: str, make: Callable[[], list[Item]]) -> list[Item]:
    """Materialised items under `<workspace>/data/`, keyed by the domain config.

    Generation can take seconds (rlve-gym) to minutes (real data sets); every process of a run,
    the zoo build and the eval reuse one file. The file is also the run's exact training data.
    """
    path = get_settings().workspace / "data" / f"{config.name}-{split}-{config.items_key()}.jsonl"
    if path.exists():
        return [Item(**json.loads(line)) for line in path.read_text().splitlines() if line]
    items = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as fh:
        for item in items:
            fh.write(json.dumps(asdict(item)) + "\n")
    os.replace(tmp, path)
    return items
