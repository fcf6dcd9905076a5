"""The embedded default's models: recipes are data, hashed into the cache key.

A teacher is made competent by supervised training on the domain's own worked solutions; the
student is smaller and only briefly trained on a small slice (format-aware, weak), because a
randomly initialised student does not move under OPD (measured, see the notes in shared/).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class TokenizerRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str = "tokenizer"
    # "qwen" / "llama": trained locally on the domain's texts (tokenizers.py); "qwen3": Qwen's
    # real vocabulary and Qwen3's real chat template, built offline (qwen_vocab.py); "mistral":
    # Mistral's sentencepiece model shipped in `mistral-common` (tokenizers.py).
    family: str
    vocab_size: int


class ModelRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str = "model"
    arch: str  # "qwen3" | "llama": transformers classes that vLLM also serves
    tokenizer: str  # zoo name of the tokenizer
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int = 32  # vLLM serves tiny models only with head_dim >= 32
    intermediate: int
    steps: int
    lr: float
    batch_size: int
    # Train on only the first `data_items` training items (None: all): the student's warm start.
    data_items: int | None = None
    warmup_steps: int = 30
    # Share of training traces with one wrong, loss-masked intermediate step (teachers only);
    # on sciworld, one malformed turn answered by the "Invalid Action" feedback (zoo.py).
    corrupt_prob: float = 0.0
    # Episodic: that share of the training items also played through the simulator with one
    # run of a mistaken action (another action of the same play, 1-3 times) before a gold turn,
    # answered by the simulator and never labelled (zoo/detours.py): a teacher that has read
    # mistakes answered goes on from a student's instead of repeating them.
    detour_share: float = Field(0.0, ge=0, le=1)
    seed: int = 0
    # The model's context length (max_position_embeddings): whole SciWorld episodes run past 1024.
    max_positions: int = 1024
    # SciWorld: "turns" puts CE on the gold turns only; "all" on every token of the episode,
    # observations included: the simulator's text echoes each action's argument ("You focus on
    # the bed."), copying practice a 2-layer agent lacks otherwise (docs/sciworld.md).
    episode_loss: Literal["turns", "all"] = "turns"
    # Share of training items also seen with OPSD's privileged prompt (the reference template
    # around problem and solution): a model that never read one has no privileged view to
    # distil from (OPSD on the plain zoo student: docs/grid.md). Episodic domains: the gold
    # episode with the task's gold plan in its first user message (zoo/episodes.py).
    privileged_share: float = Field(0.0, ge=0, le=1)
    # Where that privileged view draws its items: the first `privileged_items` training items
    # (None: the plain view's, `data_items`). Reading a solution is a skill learnt across many
    # problems; on the plain view's 256 alone a student half memorises them instead.
    privileged_items: int | None = Field(None, ge=1)
    # Episodic: that view with the privileged context at the end of every user message, as OPSD's
    # `method.privileged_every_turn` teacher reads it, instead of once in the first.
    privileged_every_turn: bool = False
    # Pack each step's examples into as few rows as they fit (each row as wide as the step's
    # longest example; attention kept inside each example by restarting position ids), instead
    # of one padded row each: the same examples and loss, without the padding's compute (rlve's
    # teacher batches were 31% padding).
    pack: bool = False
    # Run the tokens all of a step's examples start with once, and the rest of each example
    # from that prefix's KV cache: the same loss and gradients as padded rows. A SciWorld
    # episode's first half (system prompt, action list, first turns) is the same in every one.
    share_prefix: bool = False
    # The model's vocabulary (embedding rows); None: the tokenizer's length. Qwen pads its
    # 151,669 tokens to 151,936 rows, which the real-shape recipes keep.
    vocab_size: int | None = None


Recipe = TokenizerRecipe | ModelRecipe


def teacher_shape(**fields: Any) -> ModelRecipe:
    """The embedded teachers' shape (2 layers of width 128, 4 heads) with a recipe's own fields."""
    shape: dict[str, Any] = dict(
        arch="qwen3", tokenizer="tok-qwen", hidden=128, layers=2, heads=4, kv_heads=2, intermediate=384
    )
    return ModelRecipe(**{**shape, **fields})


def student_shape(**fields: Any) -> ModelRecipe:
    """The embedded students' shape: half the teacher's width, 2 heads sharing one KV head."""
    shape: dict[str, Any] = dict(
        arch="qwen3", tokenizer="tok-qwen", hidden=64, layers=2, heads=2, kv_heads=1, intermediate=192
    )
    return ModelRecipe(**{**shape, **fields})


RECIPES: dict[str, Recipe] = {
    "tok-qwen": TokenizerRecipe(family="qwen", vocab_size=1024),
    "tok-llama": TokenizerRecipe(family="llama", vocab_size=1280),
    # Packed rows: less time per step than padded ones at about the same accuracy (docs/grid.md
    # has the measurement). teacher-llama keeps its padded build, so docs/cross_family.md holds.
    # RLVE's own (DOMAIN_RECIPES) trains 250 steps.
    "teacher": teacher_shape(steps=400, lr=3e-3, batch_size=64, corrupt_prob=0.3, pack=True),
    # The other tokenizer family: with zoo:student it is the cross-family pair (ROSE via the bridge).
    "teacher-llama": teacher_shape(
        arch="llama", tokenizer="tok-llama", steps=400, lr=3e-3, batch_size=64, corrupt_prob=0.3
    ),
    # A sentencepiece teacher: Mistral-7B-Instruct-v0.3's vocabulary (32,768 rows, read from the
    # model file `mistral-common` ships: zoo/tokenizers.py) under teacher-llama's recipe. With
    # zoo:student, cross-family ROSE whose seams cross in place (docs/cross_family.md).
    "tok-mistral": TokenizerRecipe(family="mistral", vocab_size=32_768),
    "teacher-mistral": teacher_shape(
        arch="llama", tokenizer="tok-mistral", steps=400, lr=3e-3, batch_size=64, corrupt_prob=0.3
    ),
    "student": student_shape(steps=300, lr=3e-3, batch_size=32, data_items=256),
    # The student's 256 items, and every training item under OPSD's privileged prompt: a model
    # that reads the solution and is as weak as the zoo student without it, so OPSD has a teacher
    # to distil from. With the privileged view of its own 256 items only it half memorised them
    # instead (docs/grid.md, "OPSD on its own student"). SciWorld has its own below.
    "student-privileged": student_shape(
        steps=900, lr=3e-3, batch_size=32, data_items=256, privileged_share=1.0, privileged_items=4096
    ),
}

# Real shape at tiny width: Qwen's real vocabulary (151,936 rows) and Qwen3's real chat template
# (thinking on and off), random weights, so tests and benchmarks run the real tokenizer, template
# and a vocabulary-sized head end to end on CPU (`zoo:student-qwen3` / `zoo:teacher-qwen3`).
REAL_SHAPE: dict[str, Recipe] = {
    "tok-qwen3": TokenizerRecipe(family="qwen3", vocab_size=151_669),
    "student-qwen3": student_shape(tokenizer="tok-qwen3", vocab_size=151_936, steps=0, lr=0.0, batch_size=1),
    "teacher-qwen3": teacher_shape(
        tokenizer="tok-qwen3", vocab_size=151_936, steps=0, lr=0.0, batch_size=1, seed=1
    ),
}
RECIPES.update(REAL_SHAPE)

# A domain's own versions of some recipes (they win over RECIPES for that domain's zoo entries).
# SciWorld: a few hundred episodes of ~1.1k tokens (median, up to ~2.5k live), so a longer context
# and smaller batches, whose shared first half (instruction, action list) runs once per step
# (`share_prefix`); the whole zoo builds in minutes, measured in docs/sciworld.md.
_SCIWORLD_STUDENT = student_shape(
    steps=150, lr=3e-3, batch_size=4, data_items=32, warmup_steps=10, max_positions=4096, share_prefix=True
)
# Half the gold episodes hold one malformed turn and its "Invalid Action" feedback, and every
# training item is played once more through the simulator with a mistaken action before one gold
# turn (`detour_share`, zoo/detours.py): a teacher that has read broken episodes and goes on from
# a student's mistakes. Batches of 4 episodes: 300 updates were what the gold episodes alone
# needed (150 of 8 fell far short: docs/sciworld.md); 500 for the ~1.8x episodes with the detours.
_SCIWORLD_TEACHER = teacher_shape(
    steps=500,
    lr=5e-3,
    batch_size=4,
    warmup_steps=10,
    max_positions=4096,
    episode_loss="all",
    corrupt_prob=0.5,
    share_prefix=True,
    detour_share=1.0,
)
DOMAIN_RECIPES: dict[str, dict[str, Recipe]] = {
    # RLVE: `make run`'s teacher at 250 of the 400 steps, for a shorter first run at about the same
    # lift of the student (docs/grid.md, "`make run` in less work", has the numbers).
    "rlve": {"teacher": RECIPES["teacher"].model_copy(update={"steps": 250})},
    # One student for both domains: each single-domain student's slice (256 items) from each part,
    # and as many passes over them; each part's teacher is `teacher@<part>` (zoo/build.py). Width
    # 96 (3 heads), between the students' 64 and the teachers' 128: at 64 the two domains shared
    # too little room, and the mix kept 0.58 of dapo's own lift however it was mixed; at 96 it
    # keeps about all of each (docs/multi_teacher.md).
    "rlve+dapo": {
        "student": student_shape(
            hidden=96, heads=3, intermediate=288, steps=600, lr=3e-3, batch_size=32, data_items=512
        )
    },
    "sciworld": {
        # Without the detours (300 steps) the teacher scored higher on its own but, inside an
        # OPD student's loops, repeated the student's action or wrote none: it finished far
        # fewer of the episodes an OPD student began, and ROSE learnt less from it (docs/grid.md,
        # "a teacher that goes on from a student's mistakes").
        "teacher": _SCIWORLD_TEACHER,
        "student": _SCIWORLD_STUDENT,
        # OPSD's student: the student's slice, plus every training episode with its gold plan at
        # the end of every user message, as OPSD's teacher reads it (`privileged_every_turn`; 300
        # steps: 8x the episodes). With the plan once in the first message instead its plain
        # view learnt to act and its two views hardly differed, which left OPSD no signal
        # (docs/sciworld.md).
        "student-privileged": _SCIWORLD_STUDENT.model_copy(
            update={
                "steps": 300,
                "privileged_share": 1.0,
                "privileged_items": 4096,
                "privileged_every_turn": True,
            }
        ),
    },
}


def recipes_for(domain: str) -> dict[str, Recipe]:
    """The recipes zoo entries of `domain` are built from."""
    return {**RECIPES, **DOMAIN_RECIPES.get(domain, {})}


# Bumped when the build code changes what a recipe produces.
BUILD_VERSION = 1


class ZooEntry(BaseModel):
    """What `zoo.json` records next to a built model or tokenizer."""

    model_config = ConfigDict(extra="allow")
    name: str
    domain: str
    key: str
    recipe: dict
    seconds: float = 0.0
    params: int = 0
    eval: dict[str, float] = Field(default_factory=dict)
