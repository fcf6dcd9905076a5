"""RLVE puzzles on the real `rlve-gym` package (import name `Gym`).

Items are generated deterministically from (environment, seed, difficulty parameter) and carry
the environment config, so the verifier can be rebuilt anywhere with `set_config`. An environment
without `domain.parameters` takes its difficulty from rlve-gym's controller for it (`Difficulty`). rlve-gym seeds
Python's, numpy's and torch's global RNGs on every `generator()` call: generation runs in one
thread and the callers' RNG state is restored afterwards.
"""

from __future__ import annotations

import copy
import random
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from distill.domains.base import Domain, Item, Score, cached_items
from distill.domains.rlve.solutions import solution_segments, worked_solution

if TYPE_CHECKING:
    from collections.abc import Iterator

    from distill.domains.rlve.config import RLVEDomainConfig

ANSWER_MARKERS = (r"\boxed{", "}")
ANSWER_INSTRUCTION = "\n\nPut your final answer in \\boxed{}."


@contextmanager
def _preserved_rng() -> Iterator[None]:
    import numpy as np
    import torch

    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)


def _environment(identifier: str) -> Any:
    from Gym.environments import identifier2environment

    try:
        cls = identifier2environment[identifier]
    except KeyError:
        raise ValueError(
            f"domain.environments: unknown rlve-gym environment {identifier!r} "
            f"({len(identifier2environment)} known, e.g. Sorting, Multiplication, Division)"
        ) from None
    return cls(answer_markers=ANSWER_MARKERS)


class Difficulty:
    """The difficulty parameters of one environment for one split. Given in `domain.parameters`:
    fixed. Otherwise rlve-gym's own controller for it (`Gym.parameter_controllers`): its
    `get_parameter_list()` to start, raised by `update()` (as RLVE's adaptive difficulty moves)
    whenever RAISE_AFTER draws in a row give no new item, so a named environment makes as many
    distinct items as asked. A level that lists several parameter dicts takes them by seed."""

    # Draws in a row without a new item (a repeat, or a parameter the generator refuses) before
    # the controller raises the level: at 100, a level with D distinct prompts is left once ~95%
    # of them are taken, never at random.
    RAISE_AFTER = 100
    # Levels an environment may climb in one split before it is given up on.
    MAX_RAISES = 30

    def __init__(self, identifier: str, fixed: dict[str, Any] | None) -> None:
        self.identifier, self.fixed, self.misses, self.raises = identifier, fixed, 0, 0
        self.controller = None if fixed is not None else _controller(identifier)
        self.levels = [] if self.controller is None else self.controller.get_parameter_list()

    def parameter(self, seed: int) -> dict[str, Any]:
        if self.fixed is not None:
            return dict(self.fixed)
        return dict(self.levels[seed % len(self.levels)])

    def missed(self) -> None:
        """A draw that gave no new item; the level rises after RAISE_AFTER of them in a row."""
        self.misses += 1
        if self.controller is None or self.misses < self.RAISE_AFTER or self.raises >= self.MAX_RAISES:
            return
        self.controller.update()
        self.levels, self.misses, self.raises = self.controller.get_parameter_list(), 0, self.raises + 1

    def describe(self) -> str:
        if self.fixed is not None:
            return f"{self.identifier} {self.fixed} (domain.parameters)"
        return f"{self.identifier} {self.levels} (its controller, raised {self.raises} times)"


def _controller(identifier: str) -> Any:
    from Gym.parameter_controllers import identifier2controller

    return identifier2controller[identifier]()


def _generate_one(env: Any, seed: int, parameter: dict[str, Any]) -> bool:
    """`env.generator(seed, parameter)` without its per-call timeout thread (3x faster here).

    Same seeding and state as rlve-gym's own generator, so items match the package's.
    """
    from Gym.environment import manual_seed

    env.seed, env.parameter = seed, copy.deepcopy(parameter)
    try:
        manual_seed(seed)
        env._generate()
    except Exception:
        return False
    return env.parameter is not None


class RLVEDomain(Domain):
    name = "rlve"

    def __init__(self, config: RLVEDomainConfig) -> None:
        if not config.environments:
            raise ValueError("domain.environments: give at least one rlve-gym environment")
        self.config = config
        self._envs: dict[str, Any] = {}

    def _env(self, identifier: str) -> Any:
        if identifier not in self._envs:
            self._envs[identifier] = _environment(identifier)
        return self._envs[identifier]

    def _generate(self, count: int, base_seed: int, exclude: set[str], distinct: bool) -> list[Item]:
        items: list[Item] = []
        seen = set(exclude)
        envs = self.config.environments
        # Each name checked (one line for an unknown one) before its controller is looked up.
        difficulty = {e: Difficulty(e, self.config.parameters.get(e)) for e in envs if self._env(e)}
        seed = base_seed
        attempts = 0
        with _preserved_rng():
            while len(items) < count:
                identifier = envs[len(items) % len(envs)]
                env = self._env(identifier)
                level = difficulty[identifier]
                parameter = level.parameter(seed + 1)
                seed += 1
                attempts += 1
                if attempts > 50 * count + 1000:
                    raise ValueError(
                        f"rlve: could only generate {len(items)} distinct items of {count} requested from "
                        f"{level.describe()}; lower domain.train_size/eval_size, or raise or drop its "
                        "domain.parameters (without them its controller's difficulty rises as needed)"
                    )
                if not _generate_one(env, seed, parameter):
                    level.missed()
                    continue
                prompt = env.prompt_generator() + ANSWER_INSTRUCTION
                if prompt in seen:
                    level.missed()
                    continue
                level.misses = 0
                if distinct:
                    seen.add(prompt)
                config = env.get_config()
                answer = str(config["parameter"]["reference_answer"])
                items.append(
                    Item(
                        id=f"{identifier}-{seed}",
                        prompt=prompt,
                        answer=answer,
                        solution=worked_solution(identifier, config["parameter"]),
                        meta={"environment": identifier, "config": config},
                    )
                )
        return items

    @cached_property
    def _eval(self) -> list[Item]:
        return cached_items(
            self.config,
            "eval",
            lambda: self._generate(
                self.config.eval_size, self.config.eval_seed * 1000, exclude=set(), distinct=True
            ),
        )

    @cached_property
    def _train(self) -> list[Item]:
        # Training prompts never repeat an eval prompt verbatim; small environments (1-digit
        # multiplication has 1,000 distinct prompts) repeat within the training set.
        def make() -> list[Item]:
            exclude = {item.prompt for item in self._eval}
            return self._generate(self.config.train_size, 0, exclude=exclude, distinct=False)

        return cached_items(self.config, "train", make)

    def train_items(self) -> list[Item]:
        return self._train

    def eval_items(self) -> list[Item]:
        return self._eval

    def solution_segments(self, item: Item, rng: random.Random | None = None) -> list[tuple[str, bool]]:
        return solution_segments(item.meta["environment"], item.meta["config"]["parameter"], rng)

    def score(self, item: Item, response: str) -> Score:
        env = self._env(item.meta["environment"])
        env.set_config(item.meta["config"])
        result = env.verifier(response)
        return Score(
            reward=float(result["reward"]),
            correct=bool(result["accuracy"]),
            formatted=bool(result["format_score"]) and ANSWER_MARKERS[0] in response,
        )


def build(config: RLVEDomainConfig) -> RLVEDomain:
    return RLVEDomain(config)
