"""The one leaf of name -> "module:attr" tables: domains, methods, benchmarks.

A name is the folder or file, the CLI word and the MLflow tag (`rlve`, `rose`, `aime25`).
Nothing is imported until a name is resolved, and this module imports nothing of distill's, so
the config can check names against it without loading a domain, a method or torch.

Adding a domain is one line in `DOMAINS` plus its folder `distill/domains/<name>/`, which holds
its config model (`config.py`) and its builder. A multi-turn domain sets `episodic=True` and
implements the episodic protocol (`distill/episodes/protocol.py`); its methods are then the
episode versions (`MethodEntry.episodes`). A method's entry also declares what it can do
(`MethodEntry`): the only list of method capabilities in the code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal


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


@dataclass(frozen=True)
class MethodEntry:
    """A method's code and what it can do: the config, the engines, the grid and preflight read
    these fields, never a list of method names of their own."""

    train: str  # "module:attr" of `train(ctx)` on single-turn domains
    episodes: str | None  # the same on episodic domains; None: the method does not run there
    # How its teacher takes part: writes whole responses (sft), continues the student's prefix
    # (rose), or scores the student's own tokens (opd, opsd).
    teacher: Literal["writes", "continues", "scores"]
    # How the teacher's prompt shows the problem: as the student sees it, or with the domain's
    # privileged context (opsd); None: the teacher never reads the student's prompt.
    view: Literal["plain", "privileged"] | None = "plain"
    # The teacher is the student's own weights (step-0, live or EMA): no model of its own, no server.
    own_teacher: bool = False
    # The student samples its training sequences (sft trains on the teacher's instead).
    student_samples: bool = True
    # Student rollouts and loss on TRL's GRPO trainer (single-turn): rollout.engine=vllm and
    # rollout.async_teacher go through it.
    trl_rollout: bool = False
    # The teacher can score batch i while the student generates batch i+1 (rollout.async_teacher).
    async_teacher: bool = False
    # Method fields that mean something on one kind of domain only (refused on the other).
    single_turn_fields: tuple[str, ...] = ()
    episodic_fields: tuple[str, ...] = ()
    # The OPD-family losses it supports on episodic domains (None: every one, or no loss knob).
    episodic_losses: tuple[str, ...] | None = None
    # Trains on several domains in one run (`rlve+dapo`), each row scored by its domain's teacher.
    multi_domain: bool = False
    # Trains through LoRA adapters (`lora.enabled`).
    lora: bool = True

    @property
    def cross_family_scoring(self) -> bool:
        """Scores the student's tokens with a separate teacher: the byte-aligned path when the
        tokenizers differ (methods/cross_family.py)."""
        return self.teacher == "scores" and not self.own_teacher

    def target(self, episodic: bool) -> str | None:
        return self.episodes if episodic else self.train


# The OPD-family losses scored over whole episodes.
_EPISODIC_LOSSES = ("token_reward_direct", "forward_kl_topk")

METHODS: dict[str, MethodEntry] = {
    "sft": MethodEntry(
        "distill.methods.sft:train",
        "distill.methods.episode_sft:train",
        teacher="writes",
        view=None,
        student_samples=False,
        episodic_fields=("valid_turns_only",),
    ),
    "opd": MethodEntry(
        "distill.methods.opd:train",
        "distill.methods.episode_online:train_opd",
        teacher="scores",
        trl_rollout=True,
        async_teacher=True,
        multi_domain=True,
        # Cross-family OPD is single-turn: the episodic path refuses cross-family pairs.
        single_turn_fields=("group_advantage", "cross_family"),
        episodic_losses=_EPISODIC_LOSSES,
    ),
    "opsd": MethodEntry(
        "distill.methods.opsd:train",
        "distill.methods.episode_online:train_opsd",
        teacher="scores",
        view="privileged",
        own_teacher=True,
        trl_rollout=True,
        multi_domain=True,
        episodic_fields=("privileged_every_turn",),
        episodic_losses=_EPISODIC_LOSSES,
    ),
    "rose": MethodEntry(
        "distill.methods.rose:train",
        "distill.methods.episode_online:train_rose",
        teacher="continues",
        lora=False,
        single_turn_fields=("prefix_tokens", "prefix_tokens_min", "prefix_fraction"),
        episodic_fields=("student_turns", "student_turns_min", "keep_verified_only"),
    ),
}

BENCHMARKS: dict[str, BenchmarkEntry] = {
    "aime25": BenchmarkEntry("dapo", "MathArena/aime_2025"),
    "hmmt25": BenchmarkEntry("dapo", "MathArena/hmmt_feb_2025"),
    "aime24": BenchmarkEntry("dapo", "HuggingFaceH4/aime_2024"),
    # The AgentGym protocol on ScienceWorld (distill/evals/agent.py).
    "agentgym": BenchmarkEntry("sciworld"),
}


# A run over several domains names them joined by this (`rlve+dapo`): its domain word, preset folder
# (`configs/rlve+dapo/`), zoo folder and MLflow tag.
MIX = "+"
MIXED = DomainEntry("distill.domains.mixed:build", "distill.domains.mixed.config:MixConfig")


def domain_parts(name: str) -> list[str]:
    """The domains a domain word names: `rlve` -> [rlve], `rlve+dapo` -> [rlve, dapo]."""
    return name.split(MIX)


def resolve(target: str) -> Any:
    """The object a "module:attr" entry names (imports its module)."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def domain_entry(name: str) -> DomainEntry:
    """A domain's entry; a mix of single-turn domains (`rlve+dapo`) is the mixed domain's."""
    if MIX in name:
        parts = domain_parts(name)
        if len(parts) != len(set(parts)) or "" in parts:
            raise ValueError(
                f"domain {name!r}: name each domain once, joined by {MIX!r} (e.g. rlve{MIX}dapo)"
            )
        for part in parts:
            if domain_entry(part).episodic:
                raise ValueError(
                    f"domain {name!r}: a run over several domains takes single-turn ones; {part} is multi-turn"
                )
        return MIXED
    try:
        return DOMAINS[name]
    except KeyError:
        raise ValueError(f"unknown domain {name!r}; known: {', '.join(DOMAINS)}") from None


def method_entry(name: str) -> MethodEntry:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}") from None


def method_target(name: str, domain: str) -> str:
    """The "module:attr" of method `name`'s training function on `domain`."""
    entry = method_entry(name)
    episodic = domain_entry(domain).episodic
    target = entry.target(episodic)
    if target is None:
        runs_on = ", ".join(m for m, e in METHODS.items() if e.target(episodic) is not None)
        raise ValueError(
            f"method {name!r} does not run on the multi-turn domain {domain!r}; methods for {domain}: {runs_on}"
        )
    return target
