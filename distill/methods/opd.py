"""On-policy distillation (OPD): the student samples, the teacher scores the *same* token ids.

With the default loss the per-token advantage is

    A_t = coef * (logp_teacher_t - logp_student_t)        (token_reward_direct: not normalised)

and TRL's importance-sampled policy-gradient loss is applied on completion tokens only (the
prompt is never in the loss); the student's logprobs in A_t come from that loss's own forward
(signal.py). The other members of the loss family (`method.loss`, kernels/losses.py) replace
that loss with a direct divergence on the same batch. Student tokens, student logprobs and teacher
logprobs must have equal lengths per sample; a mismatch is an error. The step itself is the
on-policy core (on_policy.py) OPSD shares.

Cross-family pairs (the tokenizers differ) take the byte-aligned path (cross_family.py,
docs/cross_family.md): the teacher scores the student's text in its own tokens and the signal is
per byte group; `jsd` (one shared vocabulary) is refused there.
"""

from __future__ import annotations

from distill.config import OPDMethod
from distill.methods.batch import TeacherSide
from distill.methods.context import RunContext
from distill.methods.cross_family import CrossFamily, crosses, refusal
from distill.methods.on_policy import train_on_policy
from distill.methods.views import plain_prompt


def train(ctx: RunContext) -> None:
    cfg = ctx.config
    method = ctx.method_as(OPDMethod)
    teachers: dict[str, TeacherSide] = {}
    crossings: dict[int, CrossFamily] = {}  # one bridge a teacher, shared by the domains it teaches
    for part, engine in ctx.teacher_engines().items():
        cross = None
        if crosses(cfg, ctx.student, engine):
            reason = refusal(method, cfg.student.name, cfg.teacher_of(part).name)
            if reason:
                raise ValueError(reason)
            if id(engine) not in crossings:
                crossings[id(engine)] = CrossFamily(ctx.student.tokenizer, engine.tokenizer, method)
            cross = crossings[id(engine)]
        teachers[part] = TeacherSide(engine, plain_prompt, cross)
    train_on_policy(ctx, teachers)
