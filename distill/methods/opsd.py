"""On-policy self-distillation (OPSD): one model is student and teacher.

The student sees only the problem; the teacher is the same model with a privileged reference
solution in its prompt (`method.teacher_template`, default the reference document's). The teacher's
weights are the frozen step-0 copy (`base`, the reference setting), the live student (`live`),
or an exponential moving average of the student (`ema`) (privileged.py). Everything else -
sampling, scoring, the loss family, strict lengths, masks, logging - is OPD's core (on_policy.py).
"""

from __future__ import annotations

from distill.config import OPSDMethod
from distill.methods.batch import TeacherSide
from distill.methods.context import RunContext
from distill.methods.on_policy import train_on_policy
from distill.methods.privileged import setup_teacher
from distill.methods.views import privileged_prompt


def train(ctx: RunContext) -> None:
    callbacks = setup_teacher(ctx)
    # Its teacher is the student's own weights, for every domain of the run.
    side = TeacherSide(ctx.teacher, privileged_prompt(ctx.method_as(OPSDMethod), ctx.domain))
    train_on_policy(ctx, {part: side for part in ctx.teacher_engines()}, callbacks)
