"""OPSD's teacher: the student's own weights with a privileged view of the problem.

The teacher's weights are the frozen step-0 copy (`base`, the reference setting), the live
student (`live`), or an exponential moving average of the student (`ema`); how it sees an item is
`views.privileged_prompt` (single-turn) or an episode's privileged view (episode_online.py).
Shared by the single-turn and the episodic OPSD.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_model, save_model
from transformers import TrainerCallback

from distill.config import OPSDMethod
from distill.kernels.sharded import gather_shards, local_shard, shard_of, sharding_of

if TYPE_CHECKING:
    from distill.methods.context import RunContext


# The EMA teacher's weights inside a checkpoint folder: state the Trainer does not save itself.
EMA_FILE = "ema_teacher.safetensors"


class EMATeacher(TrainerCallback):
    """After every optimizer step: teacher <- decay * teacher + (1 - decay) * student. The teacher
    is saved with every checkpoint and restored on resume (`restore`): without it a resumed run
    would average from the step-0 weights again and train against another teacher.

    A sharded student (FSDP2, ZeRO-3) keeps the average shard by shard: each rank updates the part
    of every weight it holds of the student, never the whole; the teacher that scores (whole on
    every rank, inference only) is then assembled from the ranks' parts. Element by element the
    arithmetic is one process's, so the teacher is the same bits."""

    def __init__(self, teacher: torch.nn.Module, student: torch.nn.Module, decay: float) -> None:
        self.teacher, self.student, self.decay = teacher, student, decay
        self._parts: list[torch.Tensor] | None = None  # this rank's shards of the average

    def _pairs(self) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
        return list(zip(self.teacher.parameters(), self.student.parameters(), strict=True))

    @torch.no_grad()
    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        # The trainer has sharded the student by now; the average starts from the teacher's weights
        # (step 0's, or the resumed checkpoint's).
        if sharding_of(self.student) is not None:
            self._parts = [shard_of(t.detach(), s).clone() for t, s in self._pairs()]

    @torch.no_grad()
    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._parts is None:
            for t, s in self._pairs():
                t.mul_(self.decay).add_(s.detach().to(t.dtype), alpha=1 - self.decay)
        else:
            for part, (t, s) in zip(self._parts, self._pairs(), strict=True):
                part.mul_(self.decay).add_(local_shard(s).detach().to(part.dtype), alpha=1 - self.decay)
                t.copy_(gather_shards(part, s))
        if control.should_save and state.is_world_process_zero:
            # Into the `checkpoint-N` folder the Trainer writes this step's checkpoint to, before
            # it does: DistillCallback renames it to `step-N` (the commit point) only once the
            # Trainer is done, so no `step-N` ever lacks its teacher. (`on_save` would be too late:
            # it runs after DistillCallback's, which comes first in the trainer's callbacks.)
            folder = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            save_model(self.teacher, str(folder / EMA_FILE))

    def restore(self, checkpoint: Path) -> None:
        """The teacher as it was when `checkpoint` was written (bit for bit)."""
        path = checkpoint / EMA_FILE
        if not path.exists():
            raise ValueError(
                f"{checkpoint} has no {EMA_FILE}: it was written before distill saved the EMA teacher, "
                "so resuming would restart the teacher from the step-0 weights; start a new run"
            )
        device = next(self.teacher.parameters()).device
        load_model(self.teacher, path, device=str(device))


def setup_teacher(ctx: RunContext) -> list[Any]:
    """ctx.teacher as `method.teacher_weights` says; returns the callbacks that keep it (EMA)."""
    cfg = ctx.config
    method = ctx.method_as(OPSDMethod)
    callbacks: list[Any] = []
    if method.teacher_weights == "live":
        # The student being trained scores with the privileged prompt (no gradient through it).
        ctx.teacher = ctx.student
    else:
        # ctx.teacher was loaded from the student's own path: it is the step-0 weights.
        teacher = ctx.local_teacher()
        teacher.model.eval()
        teacher.model.requires_grad_(False)
        if method.teacher_weights == "ema":
            if cfg.lora.enabled:
                raise ValueError(
                    "method.teacher_weights=ema averages full weights; it cannot be combined with lora"
                )
            ema = EMATeacher(teacher.model, ctx.student.model, method.ema_decay)
            if ctx.resume_from is not None:
                ema.restore(ctx.resume_from)
            callbacks.append(ema)
    return callbacks
