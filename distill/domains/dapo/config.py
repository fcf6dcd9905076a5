"""The `domain:` section of a dapo run."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from distill.config import DomainBase
from distill.registry import BENCHMARKS


class DapoDomainConfig(DomainBase):
    """Math with a boxed final answer graded by math-verify (distill/domains/dapo/)."""

    # Fields naming a user's own problems: the zoo's models learn from the domain's own worked
    # solutions whatever these say (zoo/build.py `zoo_domain`); the run trains and evaluates on them.
    user_data_fields: ClassVar[tuple[str, ...]] = ("data", "eval_benchmark", "eval_data")

    name: Literal["dapo"] = "dapo"
    # Training problems: a hub id (e.g. BytedTsinghua-SIA/DAPO-Math-17k), a local parquet/jsonl/json
    # file or folder (verl, RLVE or plain problem/answer rows); None: the embedded generated problems.
    data: str | None = None
    # Eval items: a benchmark (aime25, hmmt25, aime24) read from `eval_data` (file or folder) or
    # its hub id; None: held-out problems of the training source.
    eval_benchmark: str | None = None
    eval_data: str | None = None
    # Shuffles the loaded training problems (after deduplication by problem text).
    seed: int = 0
    # The embedded generator: operations per problem and the largest intermediate value.
    min_steps: int = Field(2, ge=1)
    max_steps: int = Field(4, ge=1)
    max_value: int = Field(20, ge=10)
    # math-verify worker processes and the per-item timeout of its parse/verify calls.
    grade_workers: int = Field(2, ge=1)
    grade_timeout_s: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> DapoDomainConfig:
        if self.max_steps < self.min_steps:
            raise ValueError(f"max_steps ({self.max_steps}) must be >= min_steps ({self.min_steps})")
        known = [name for name, entry in BENCHMARKS.items() if entry.domain == "dapo"]
        if self.eval_benchmark is not None and self.eval_benchmark not in known:
            raise ValueError(f"unknown eval_benchmark {self.eval_benchmark!r}; known: {', '.join(known)}")
        if self.eval_data is not None and self.eval_benchmark is None:
            raise ValueError("eval_data needs eval_benchmark (the benchmark those problems are)")
        return self
