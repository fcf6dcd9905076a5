"""One simulator pool per test session (JVM start-up is the expensive part) and real tokenizers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY_RECIPES, tiny_domain

from distill.domains.sciworld import SciWorldDomain, look_before_focus
from distill.domains.sciworld.config import SciWorldDomainConfig
from distill.domains.sciworld.pool import EnvPool
from distill.domains.sciworld.prompt import format_response
from distill.episodes.play import ScriptedAgent

# Two workers at most: CI and this machine have two cores.
POOL_SIZE = 2


@pytest.fixture(scope="session")
def sw_pool() -> Iterator[EnvPool]:
    with EnvPool(POOL_SIZE, heap="1g", step_limit=100, timeout_s=120) as pool:
        yield pool


@pytest.fixture(scope="session")
def tokenizer_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The zoo's two tokenizer families (trained locally in seconds), for real chat templates."""
    from distill.zoo.build import ensure_built

    root = tmp_path_factory.mktemp("sw-tokenizers")
    domain = tiny_domain()
    return {
        family: ensure_built(root, f"tok-{family}", domain, show_progress=False, recipes=TINY_RECIPES)
        for family in ("qwen", "llama")
    }


@pytest.fixture(scope="session")
def sw_domain(sw_pool: EnvPool) -> SciWorldDomain:
    """The sciworld domain on the session's pool (a borrowed pool: close() leaves it running)."""
    return SciWorldDomain(SciWorldDomainConfig(tasks=["4-2"]), pool=sw_pool)


def gold(writer: str = "gold", look: bool = False) -> ScriptedAgent:
    """The simulator's gold player, writing SciWorld's AgentGym turns."""
    return ScriptedAgent(format_response, writer=writer, script=look_before_focus if look else None)
