"""Online multi-turn distillation on SciWorld episodes: ROSE and OPD, turn by turn.

- ROSE: the live student plays the first N turns (N fixed, or drawn per episode from
  [student_turns_min, student_turns]), the teacher takes over the following turns until the
  episode ends or the turn limit; CE only on the teacher's turns (mask 1); environment text and
  the student's turns are mask 0.
- OPD: the live student plays the whole episode; the teacher scores every student turn in the
  same context (the same token ids); per token A_t = coef * (logp_teacher - logp_student),
  on-policy policy gradient on student-turn tokens only (environment tokens masked).

Both run on a `transformers.Trainer` whose batch of item indices becomes a batch of episodes
inside `training_step`, as `distill/methods/rose.py` does for single-turn ROSE, so optimizer,
clipping, accumulation, checkpoints, resume and `DistillCallback` are the Trainer's. Episodes are
in the student's tokens; a teacher of another tokenizer family writes its ROSE turns through
`BridgedAgent` (turn by turn re-encoding); OPD needs one tokenizer (the teacher scores the
student's own ids).
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from distill.methods.episodes import BridgedAgent, episode_example, episode_stats, teacher_turn_stats
from distill.methods.rose import collate

if TYPE_CHECKING:
    import torch

    from distill.domains.sciworld import SciWorldDomain
    from distill.domains.sciworld.episode import Episode
    from distill.methods.context import RunContext


def same_tokenizer(ctx: RunContext) -> bool:
    return bool(ctx.student.tokenizer.get_vocab() == ctx.teacher.tokenizer.get_vocab())


def student_turns_for(domain: SciWorldDomain, rng: random.Random) -> Any:
    """N per episode: fixed `student_turns`, or drawn from [student_turns_min, student_turns]."""
    cfg = domain.config
    low = cfg.student_turns_min
    drawn: dict[int, int] = {}

    def pick(ep: Episode) -> int:
        if low is None:
            return cfg.student_turns
        return drawn.setdefault(ep.uid, rng.randint(low, cfg.student_turns))

    return pick


def play_batch(
    ctx: RunContext, engine: Any, items: list[Any], method: str, rng: random.Random
) -> list[Episode]:
    from distill.domains.sciworld.play import EngineAgent, PlayConfig, handover, play, single
    from distill.evals.agent import frame_for

    cfg = ctx.config
    domain: SciWorldDomain = ctx.domain  # type: ignore[assignment]
    dcfg = domain.config
    student = EngineAgent(engine, "student", cfg.rollout.temperature, cfg.rollout.top_p, cfg.eval.batch_size)
    if method == "rose":
        teacher_temp = float(getattr(cfg.method, "teacher_temperature", 0.0))
        teacher: Any = EngineAgent(ctx.teacher, "teacher", teacher_temp, 1.0, cfg.eval.batch_size)
        if not same_tokenizer(ctx):
            teacher = BridgedAgent(teacher)
        policy = handover(student, teacher, student_turns_for(domain, rng))
    else:
        policy = single(student)
    return play(
        domain.pool(),
        items,
        policy,
        ctx.student.tokenizer,
        frame_for(ctx.student.tokenizer, ctx.student.enable_thinking),
        PlayConfig(max_turns=dcfg.max_turns, turn_max_new_tokens=dcfg.turn_max_new_tokens),
    )


def opd_loss(
    model: Any, ctx: RunContext, episodes: list[Episode], coef: float, clip: float | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """OPD over the student's turns of whole episodes: `method.loss` token_reward_direct
    (sampled-token advantages, on-policy so the ratio is 1) or forward_kl_topk."""
    import torch

    rows = [ep for ep in episodes if not ep.failed and any(ep.mask({"student"}))]
    if not rows:
        raise ValueError("opd: no episode of this step has a student turn to train on")
    kind = str(getattr(ctx.config.method, "loss", "token_reward_direct"))
    if kind == "forward_kl_topk":
        return _topk_loss(model, ctx, rows)
    if kind != "token_reward_direct":
        raise ValueError(
            f"method.loss={kind}: multi-turn OPD supports token_reward_direct and forward_kl_topk"
        )
    prompts = [ep.ids[:1] for ep in rows]
    completions = [ep.ids[1:] for ep in rows]
    teacher_rows = ctx.teacher.score(prompts, completions)
    batch = collate([(ep.ids, ep.ids) for ep in rows], ctx.student.tokenizer.pad_token_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logp_B_T = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["input_ids"][:, 1:].unsqueeze(-1))
    logp_B_T = logp_B_T.squeeze(-1)
    losses, gaps, n_tokens = [], [], 0
    for i, ep in enumerate(rows):
        n = len(ep.ids) - 1
        if len(teacher_rows[i]) != n:
            raise ValueError(
                f"opd: episode {ep.item.id} has {n} tokens but {len(teacher_rows[i])} teacher logprobs"
            )
        mask = torch.tensor(ep.mask({"student"})[1:], dtype=torch.float32)
        student_lp = logp_B_T[i, :n]
        gap = torch.tensor(teacher_rows[i]) - student_lp.detach()
        adv = coef * gap
        if clip is not None:
            adv = adv.clamp(-clip, clip)
        losses.append(-(adv * student_lp * mask).sum())
        gaps.append(gap[mask.bool()])
        n_tokens += int(mask.sum())
    loss = torch.stack(losses).sum() / max(n_tokens, 1)
    gap_all = torch.cat(gaps)
    stats = {
        "kl/reverse_kl_mean": float(-gap_all.mean()),
        "kl/reverse_kl_std": float(gap_all.std()) if gap_all.numel() > 1 else 0.0,
        "kl/advantage_mean": float(coef * gap_all.mean()),
    }
    return loss, stats


def _topk_loss(model: Any, ctx: RunContext, rows: list[Episode]) -> tuple[torch.Tensor, dict[str, float]]:
    """KL(teacher || student) over the teacher's top-k at every student-turn position."""
    import torch

    from distill.methods.losses import masked_mean, topk_forward_kl_per_token, topk_overlap

    method = ctx.config.method
    k, tail = int(getattr(method, "top_k", 20)), bool(getattr(method, "topk_tail", True))
    batch = collate([(ep.ids, ep.ids) for ep in rows], ctx.student.tokenizer.pad_token_id)
    ids, attn = batch["input_ids"], batch["attention_mask"]
    mask_B_T = torch.zeros(ids.shape[0], ids.shape[1] - 1)
    for i, ep in enumerate(rows):
        mask_B_T[i, : len(ep.ids) - 1] = torch.tensor(ep.mask({"student"})[1:], dtype=torch.float32)
    with torch.no_grad():
        teacher_lp = torch.log_softmax(
            ctx.teacher.model(input_ids=ids, attention_mask=attn).logits.float()[:, :-1], -1
        )
        top = teacher_lp.topk(k, dim=-1)
    student_lp = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits.float()[:, :-1], -1)
    kl_B_T = topk_forward_kl_per_token(student_lp, top.indices, top.values, tail)
    loss = masked_mean(kl_B_T, mask_B_T)
    sampled = ids[:, 1:].unsqueeze(-1)
    gap = (teacher_lp.gather(-1, sampled) - student_lp.detach().gather(-1, sampled)).squeeze(-1)[
        mask_B_T.bool()
    ]
    return loss, {
        "kl/reverse_kl_mean": float(-gap.mean()),
        "kl/reverse_kl_std": float(gap.std()) if gap.numel() > 1 else 0.0,
        "kl/topk_overlap": topk_overlap(student_lp.detach(), top.indices, mask_B_T),
    }


def make_trainer_class(method: str) -> type:
    from transformers import Trainer

    class EpisodeTrainer(Trainer):
        """A Trainer whose batch of item indices becomes a batch of episodes inside each step."""

        distill_ctx: RunContext
        _engine: Any = None

        def training_step(
            self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
        ) -> torch.Tensor:
            from distill.engines.hf import HFEngine

            ctx = self.distill_ctx
            cfg = ctx.config
            step = self.state.global_step
            items = [ctx.extras["items"][int(i)] for i in inputs["item_index"]]
            items = [item for item in items for _ in range(cfg.rollout.num_generations)]
            rng = random.Random(cfg.seed * 1_000_003 + step)
            live: Any = self.model
            if self._engine is None:
                self._engine = HFEngine(live, ctx.student.tokenizer, ctx.student.enable_thinking)
            t0 = time.perf_counter()
            was_training = live.training
            live.eval()
            episodes = play_batch(ctx, self._engine, items, method, rng)
            if was_training:
                live.train()
            t1 = time.perf_counter()
            dcfg = ctx.domain.config  # type: ignore[attr-defined]
            extra: dict[str, float] = {}
            if method == "rose":
                ok = [ep for ep in episodes if not ep.failed]
                examples = [episode_example(ep, ["teacher"]) for ep in ok if sum(ep.mask({"teacher"}))]
                if not examples:
                    raise ValueError(
                        f"rose: no episode of step {step + 1} reached a teacher turn (all ended within the "
                        "student's turns); lower domain.student_turns"
                    )
                batch = collate(examples, ctx.student.tokenizer.pad_token_id)
                loss = super().training_step(model, batch, None)
                extra = teacher_turn_stats(episodes, dcfg.turn_max_new_tokens)
            else:
                model.train()
                coef = float(getattr(cfg.method, "coef", 1.0))
                clip = getattr(cfg.method, "advantage_clip", None)
                raw, extra = opd_loss(model, ctx, episodes, coef, clip)
                self.accelerator.backward(raw / self.args.gradient_accumulation_steps)
                loss = raw.detach()
            t2 = time.perf_counter()
            lengths = [t.tokens for ep in episodes for t in ep.turns if t.writer == "student"]
            truncated = [t.truncated for ep in episodes for t in ep.turns if t.writer == "student"]
            ctx.log.add(
                {
                    **episode_stats(episodes),
                    **extra,
                    "perf/gen_time_s": t1 - t0,
                    "perf/train_time_s": t2 - t1,
                    "student/completion_tokens_mean": sum(lengths) / max(len(lengths), 1),
                    "student/completion_tokens_max": float(max(lengths, default=0)),
                    "student/truncation_rate": sum(truncated) / max(len(truncated), 1),
                    "_tokens": float(sum(len(ep.ids) for ep in episodes)),
                }
            )
            ctx.log.samples(
                step + 1,
                [ep.record(dcfg.negative_score) for ep in episodes[: cfg.tracking.sample_rows]],
            )
            return loss

    return EpisodeTrainer


def train(ctx: RunContext, method: str) -> None:
    """Train the student online on episodes: `method` is "rose" or "opd"."""
    from datasets import Dataset
    from transformers import TrainingArguments

    from distill.methods.callbacks import DistillCallback, quiet, trainer_common_args

    if method not in ("rose", "opd"):
        raise ValueError(f"multi-turn online method must be rose or opd, not {method!r}")
    cfg = ctx.config
    if method == "opd" and not same_tokenizer(ctx):
        raise ValueError(
            f"opd on sciworld scores the student's own tokens: student and teacher must share a "
            f"tokenizer ({cfg.student.name} and {cfg.teacher.name} differ); rose and sft bridge "
            "tokenizers turn by turn"
        )
    items = ctx.domain.train_items()
    ctx.extras["items"] = items
    args = TrainingArguments(
        **trainer_common_args(ctx), per_device_train_batch_size=cfg.rollout.prompts_per_step
    )

    class _Callback(DistillCallback):
        def on_log(self, args, state, control, logs=None, **kw):  # type: ignore[no-untyped-def]
            if logs and "loss" in logs and method == "rose":
                self.ctx.log.add({"train/ce_loss": float(logs["loss"])})
            return super().on_log(args, state, control, logs=logs, **kw)

    trainer = make_trainer_class(method)(
        model=ctx.student.model,
        args=args,
        train_dataset=Dataset.from_list([{"item_index": i} for i in range(len(items))]),
        data_collator=_indices,
        processing_class=ctx.student.tokenizer,
        callbacks=[_Callback(ctx)],
    )
    trainer.distill_ctx = ctx
    quiet(trainer).train(resume_from_checkpoint=str(ctx.resume_from) if ctx.resume_from else None)
    ctx.student.model = trainer.model


def _indices(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"item_index": [int(row["item_index"]) for row in rows]}


def train_rose(ctx: RunContext) -> None:
    """Method entry for `rose` on a multi-turn domain."""
    train(ctx, "rose")


def train_opd(ctx: RunContext) -> None:
    """Method entry for `opd` on a multi-turn domain."""
    train(ctx, "opd")
