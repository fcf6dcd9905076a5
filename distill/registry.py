"""The one leaf of name -> "module:attr" tables: domains, methods, benchmarks.

A name is the folder or file, the CLI word and the MLflow tag (`rlve`, `rose`, `aime25`).
Nothing is imported until a name is resolved, and this module imports nothing of distill's, so
the config can check names against it without loading a domain, a method or torch.

Adding a domain is one line in `DOMAINS` plus its folder `distill/domains/<name>/`, which holds
its config model (`config.py`) and its builder. A multi-turn domain sets `episodic=True` and
implements the episodic protocol (`distill/episodes/protocol.py`); its methods are then the
episode versions (`EPISODE_METHODS`), for every method they list.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DomainEntry:
    build: str  # "module:attr" of `build(config) -> Domain`
    config: str  # "module:attr" of its pydantic config model (a `DomainBase` subclass)
    episodic: bool = False  # trained and evaluated on multi-turn episodes


@dataclass(frozen=True)
class BenchmarkEntry:
    domain: str  # the domain whose eval it is
    hub_id: str | None = None  # where its problems live when no local file is given
    split: str = "train"


DOMAINS: dict[str, DomainEntry] = {
    "rlve": DomainEntry("distill.domains.rlve:build", "distill.domains.rlve.config:RLVEDomainConfig"),
    "dapo": DomainEntry("distill.domains.dapo:build", "distill.domains.dapo.config:DapoDomainConfig"),
    "sciworld": DomainEntry(
        "distill.domains.sciworld:build",
        "distill.domains.sciworld.config:SciWorldDomainConfig",
        episodic=True,
    ),
}

# Single-turn methods: one response per prompt.
METHODS: dict[str, str] = {
    "sft": "distill.methods.sft:train",
    "opd": "distill.methods.opd:train",
    "opsd": "distill.methods.opsd:train",
    "rose": "distill.methods.rose:train",
}

# The same methods on whole episodes (episodic domains); a method missing here does not run on them.
EPISODE_METHODS: dict[str, str] = {
    "sft": "distill.methods.episode_sft:train",
    "rose": "distill.methods.episode_online:train_rose",
    "opd": "distill.methods.episode_online:train_opd",
    "opsd": "distill.methods.episode_online:train_opsd",
}

BENCHMARKS: dict[str, BenchmarkEntry] = {
    "aime25": BenchmarkEntry("dapo", "MathArena/aime_2025"),
    "hmmt25": BenchmarkEntry("dapo", "MathArena/hmmt_feb_2025"),
    "aime24": BenchmarkEntry("dapo", "HuggingFaceH4/aime_2024"),
    # The AgentGym protocol on ScienceWorld (distill/evals/agent.py).
    "agentgym": BenchmarkEntry("sciworld"),
}


def resolve(target: str) -> Any:
    """The object a "module:attr" entry names (imports its module)."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def domain_entry(name: str) -> DomainEntry:
    try:
        return DOMAINS[name]
    except KeyError:
        raise ValueError(f"unknown domain {name!r}; known: {', '.join(DOMAINS)}") from None


def method_target(name: str, domain: str) -> str:
    """The "module:attr" of method `name`'s training function on `domain`."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    if not domain_entry(domain).episodic:
        return METHODS[name]
    if name not in EPISODE_METHODS:
        raise ValueError(
            f"method {name!r} does not run on the multi-turn domain {domain!r}; "
            f"methods for {domain}: {', '.join(EPISODE_METHODS)}"
        )
    return EPISODE_METHODS[name]
