"""DAPO-Math: problems with a boxed final answer, graded by math-verify in worker processes.

Training problems come from DAPO-Math-17k (hub id or a local parquet/jsonl/json file in the verl
layout, or plain problem/answer rows) or, by default, from the embedded generator
(`problems.py`). Both go through the same row loader (`data.py`) and the same
grader, so the embedded default exercises the real-data path. Eval items are a benchmark
(aime25, hmmt25, aime24) when `domain.eval_benchmark` is set, else held-out problems.
"""

from __future__ import annotations

import random
from functools import cached_property
from typing import TYPE_CHECKING, Any

from distill.domains.base import Domain, Item, Score, cached_items
from distill.domains.dapo import problems
from distill.domains.dapo.data import load_benchmark, load_problems, row_to_item
from distill.domains.dapo.grader import MathGrader

if TYPE_CHECKING:
    from distill.domains.dapo.config import DapoDomainConfig

PREFIX = "dapo"


def _key(prompt: str) -> str:
    # Duplicates in DAPO-Math-17k differ at most in whitespace.
    return " ".join(prompt.split())


def dedup(items: list[Item]) -> list[Item]:
    """First occurrence of each problem text."""
    seen: set[str] = set()
    out = []
    for item in items:
        key = _key(item.prompt)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


class DapoDomain(Domain):
    name = "dapo"

    def __init__(self, config: DapoDomainConfig) -> None:
        self.config = config
        self.grader = MathGrader(config.grade_workers, config.grade_timeout_s)

    # -- the embedded generator ------------------------------------------------------------------

    def _generate(self, count: int, base_seed: int, exclude: set[str]) -> list[Item]:
        cfg = self.config
        items: list[Item] = []
        seen = set(exclude)
        seed = base_seed
        while len(items) < count:
            seed += 1
            if seed - base_seed > 50 * count + 1000:
                raise ValueError(
                    f"dapo: only {len(items)} distinct problems of {count} requested; lower "
                    "domain.train_size/eval_size or raise domain.max_steps/max_value"
                )
            row = problems.generate(seed, cfg.min_steps, cfg.max_steps, cfg.max_value)
            item = row_to_item(row, f"dapo generator: seed {seed}", seed, PREFIX)
            if _key(item.prompt) in seen:
                continue
            seen.add(_key(item.prompt))
            items.append(item)
        return items

    # -- real data ---------------------------------------------------------------------------------

    @cached_property
    def _loaded(self) -> list[Item]:
        """Deduplicated, seed-shuffled training source (real data only)."""
        assert self.config.data is not None
        items = dedup(load_problems(self.config.data, PREFIX))
        if not items:
            raise ValueError(f"domain.data: {self.config.data} holds no problems")
        random.Random(self.config.seed).shuffle(items)
        return items

    @cached_property
    def _eval(self) -> list[Item]:
        cfg = self.config
        if cfg.eval_benchmark is not None:
            return load_benchmark(cfg.eval_benchmark, cfg.eval_data)[: cfg.eval_size]
        if cfg.data is not None:
            return self._loaded[: cfg.eval_size]
        return cached_items(cfg, "eval", lambda: self._generate(cfg.eval_size, cfg.eval_seed * 1000, set()))

    @cached_property
    def _train(self) -> list[Item]:
        cfg = self.config
        # Training never repeats an eval problem.
        exclude = {_key(item.prompt) for item in self._eval}
        if cfg.data is not None:
            pool = self._loaded if cfg.eval_benchmark is not None else self._loaded[cfg.eval_size :]
            return [item for item in pool if _key(item.prompt) not in exclude][: cfg.train_size]
        return cached_items(cfg, "train", lambda: self._generate(cfg.train_size, 0, exclude))

    def train_items(self) -> list[Item]:
        return self._train

    def eval_items(self) -> list[Item]:
        return self._eval

    # -- solutions and grading ---------------------------------------------------------------------

    def solution_segments(self, item: Item, rng: random.Random | None = None) -> list[tuple[str, bool]]:
        lines: list[list[Any]] | None = item.meta.get("lines")
        if lines:
            return problems.segments(lines, int(item.answer), rng)
        return super().solution_segments(item, rng)

    def score(self, item: Item, response: str) -> Score:
        return self.score_batch([item], [response])[0]

    def score_batch(self, items: list[Item], responses: list[str]) -> list[Score]:
        if len(items) != len(responses):
            raise ValueError(f"score_batch: {len(items)} items but {len(responses)} responses")
        grades = self.grader.grade_batch([item.answer for item in items], responses)
        return [Score(reward=float(g.correct), correct=g.correct, formatted=g.formatted) for g in grades]

    def benchmark_items(
        self, name: str, data: str | None, count: int, seed: int = 0
    ) -> tuple[list[Item], str]:
        items = load_benchmark(name, data)[:count]
        return items, f"{len(items)} problems of {name} from {data or 'its hub id'}"

    def close(self) -> None:
        """Stop the grader's worker processes (they also stop when the domain is collected)."""
        self.grader.close()


def build(config: DapoDomainConfig) -> DapoDomain:
    return DapoDomain(config)
