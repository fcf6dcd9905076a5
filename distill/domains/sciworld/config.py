"""The `domain:` section of a sciworld run: which items, and how the simulators run."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from distill.config import DomainBase


class SciWorldDomainConfig(DomainBase):
    """ScienceWorld episodes in the AgentGym format (distill/domains/sciworld/).

    Token budgets are the run's, as on every domain: `rollout.max_new_tokens` per student turn,
    `eval.max_new_tokens` per eval turn, `method.teacher_max_tokens` per ROSE teacher turn.
    """

    # 2: gold paths are played by JVMs that hash alike (pool.JVM_DETERMINISM); items and zoo models
    # made before that depended on what a JVM had loaded first, and are not reused.
    data_version: ClassVar[int] = 2
    # How episodes are played later (pool, heap, turn limits, the turn's end), not which items
    # there are: they do not re-key the materialised items.
    runtime_fields: ClassVar[tuple[str, ...]] = (
        "pool_size",
        "java_heap",
        "max_turns",
        "negative_score",
        "step_timeout_s",
        "stop_at_action",
    )

    name: Literal["sciworld"] = "sciworld"
    # Episodes are slow to materialise (a gold play each): smaller sets than single-turn domains.
    train_size: int = Field(512, ge=1)
    eval_size: int = Field(40, ge=1)
    # ScienceWorld task ids (env.tasks keys) of the embedded items; train items come from the
    # simulator's train variations (and its dev variations with `train_on_dev`), eval items
    # from its test variations. The default pair's task texts never vary: a 2-layer teacher
    # does not read a detail back from the task text (4-2's box colour, 7-2's "shortest"),
    # and 7-3's second focus follows from the episode going on (docs/sciworld.md).
    tasks: list[str] = Field(default_factory=lambda: ["7-1", "7-3"])
    train_on_dev: bool = True
    # Insert "look around" before a gold "focus on" that follows a move: ScienceWorld's gold
    # paths often focus on something in a room they just entered without looking, so a model
    # imitating them would have to guess the object's name.
    gold_look: bool = True
    # Environment worker processes, one JVM each; episodes run in parallel across them.
    pool_size: int = Field(2, ge=1)
    # Heap cap of each JVM, passed as JAVA_TOOL_OPTIONS=-Xmx<java_heap>.
    java_heap: str = Field("1g", pattern=r"^[0-9]+[kKmMgG]$")
    # A turn ends at its action line, as a stop string ends it: a response that runs on past
    # "Action:\n<action>" is cut there and closed with an EOS, so the text after it (a model that
    # goes on to predict the next observation) never enters the episode (docs/sciworld.md).
    stop_at_action: bool = True
    # The episode's turn budget: assistant turns before it is cut off.
    max_turns: int = Field(20, ge=1)
    # The simulator ends an episode after this many moves (its envStepLimit).
    env_step_limit: int = Field(100, ge=1)
    # A final score of -100 (irreversible failure): "zero" counts it as 0, "keep" as -100.
    negative_score: Literal["zero", "keep"] = "zero"
    # Seconds one reset/step may take before its worker counts as hung and is restarted.
    step_timeout_s: float = Field(120.0, gt=0)
