"""The `method:` section: one model per method, chosen by `name` (the registry's key)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from distill.config.base import Strict


class SFTMethod(Strict):
    name: Literal["sft"] = "sft"
    # Keep only teacher trajectories the verifier accepts.
    keep_verified_only: bool = True
    # Teacher trajectories written per training prompt.
    samples_per_prompt: int = Field(1, ge=1)
    # Teacher sampling temperature for its trajectories; 0 is greedy.
    temperature: float = Field(0.0, ge=0)
    epochs: float = Field(1.0, gt=0)
    # Episodic domains: CE only on the teacher turns whose action the environment accepted; its
    # rejected ones ("No known action matches that input.") stay in the context, unlabelled, as
    # the zoo teacher's detours were (a student should not learn to guess).
    valid_turns_only: bool = False


class OnPolicyKL(Strict):
    """What OPD and OPSD share: the student samples, a teacher scores the same token ids."""

    # token_reward_direct: A_t = coef * (logp_teacher - logp_student) into the policy-gradient loss,
    # not normalised. k1, k3/low_var_kl: direct KL losses on sampled tokens. forward_kl_topk:
    # KL(teacher || student) over the teacher's top_k. jsd: full-vocabulary generalised JSD (beta).
    loss: Literal["token_reward_direct", "k1", "k3", "low_var_kl", "forward_kl_topk", "jsd"] = (
        "token_reward_direct"
    )
    coef: float = 1.0
    # Optional symmetric clamp of the advantage; None keeps the reference semantics.
    advantage_clip: float | None = Field(None, gt=0)
    top_k: int = Field(20, ge=1)
    # forward_kl_topk: match the teacher's mass outside its top-k as one tail bucket.
    topk_tail: bool = True
    # jsd: 0 forward KL, 1 reverse KL, in between generalised JSD (TRL's convention).
    beta: float = Field(0.5, ge=0, le=1)


class OPDMethod(OnPolicyKL):
    name: Literal["opd"] = "opd"
    # Cross-family pairs (docs/cross_family.md): a byte group's signal on the student's tokens.
    # spread: on every student token of the group (the exact gradient of the group objective);
    # last: on the group's last student token only.
    group_advantage: Literal["spread", "last"] = "spread"
    # auto: the byte-aligned cross-family path when the tokenizers differ; always: also for a
    # shared tokenizer (a check: it gives exactly same-family OPD).
    cross_family: Literal["auto", "always"] = "auto"


# The reference document's privileged teacher prompt (OPSD): problem, reference solution, transition.
OPSD_TEMPLATE = (
    "Problem: {problem}\n\n"
    "Here is a reference solution to this problem:\n"
    "=== Reference Solution Begin ===\n"
    "{solution}\n"
    "=== Reference Solution End ===\n\n\n"
    "After understanding the reference solution and the rationale behind each step, now articulate your "
    "own step-by-step reasoning that derives the same final answer to the problem above."
)


class OPSDMethod(OnPolicyKL):
    """One model is student and teacher; the teacher's prompt carries a privileged solution."""

    name: Literal["opsd"] = "opsd"
    # The teacher's user message; {problem} is the student's prompt, {solution} the domain's
    # privileged context (worked solution, else the reference answer).
    teacher_template: str = OPSD_TEMPLATE
    # base: frozen step-0 weights; live: the student being trained; ema: an average of the student.
    teacher_weights: Literal["base", "live", "ema"] = "base"
    ema_decay: float = Field(0.99, gt=0, lt=1)
    # Episodic: the privileged context at the end of every user message of the teacher's view,
    # next to each turn it scores, instead of once in the first (teacher_template unused). A
    # small model does not read a plan ~1k tokens back (docs/sciworld.md).
    privileged_every_turn: bool = False

    @field_validator("teacher_template")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        try:
            value.format(problem="", solution="")
        except (KeyError, IndexError) as exc:
            raise ValueError(f"unknown placeholder {exc}; use {{problem}} and {{solution}}") from None
        return value


class ROSEMethod(Strict):
    """The student writes a prefix (mask 0), the teacher continues it (mask 1), CE on the
    teacher's tokens only.

    Single-turn domains: the prefix is K student tokens of one response and the teacher writes at
    most t tokens in the same assistant turn. Episodic domains: the prefix is the student's first
    N turns and the teacher writes the following turns, each of at most t tokens. A field the
    run's domain cannot honour is refused (`RunConfig._method_fits_domain`).
    """

    name: Literal["rose"] = "rose"
    # K in student tokens; with prefix_tokens_min set, the upper end of K's range (single-turn).
    prefix_tokens: int = Field(64, ge=0)
    # Draw K uniformly from [prefix_tokens_min, prefix_tokens] per sample (capped at the student's
    # response); None: K is fixed. A fixed K never trains the first K positions, which then drift.
    prefix_tokens_min: int | None = Field(0, ge=0)
    # Cut at this fraction of the student's full response instead (overrides prefix_tokens).
    prefix_fraction: float | None = Field(None, ge=0, le=1)
    # N: the student's turns before the teacher takes over, with student_turns_min set the upper
    # end of N's range, drawn per episode (episodic domains).
    student_turns: int = Field(2, ge=0)
    student_turns_min: int | None = Field(0, ge=0)
    # t: the teacher's budget per assistant turn it writes, in teacher tokens.
    teacher_max_tokens: int = Field(64, ge=1)
    # Teacher sampling temperature for its continuation; 0 is greedy.
    teacher_temperature: float = Field(0.0, ge=0)
    # Episodic: CE only on the episodes that end in success (full score), as teacher-SFT's
    # keep_verified_only; a step none of whose episodes succeeds updates nothing. Keeping only
    # them did not help on sciworld (docs/grid.md), so the preset leaves it off.
    keep_verified_only: bool = False

    @model_validator(mode="after")
    def _range(self) -> ROSEMethod:
        if self.prefix_tokens_min is not None and self.prefix_tokens_min > self.prefix_tokens:
            raise ValueError(
                f"prefix_tokens_min ({self.prefix_tokens_min}) is above prefix_tokens ({self.prefix_tokens})"
            )
        if self.student_turns_min is not None and self.student_turns_min > self.student_turns:
            raise ValueError(
                f"student_turns_min ({self.student_turns_min}) is above student_turns ({self.student_turns})"
            )
        return self


MethodConfig = Annotated[SFTMethod | OPDMethod | OPSDMethod | ROSEMethod, Field(discriminator="name")]
