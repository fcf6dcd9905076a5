"""Online multi-turn distillation on an episodic domain: ROSE and OPD, turn by turn.

- ROSE: the live student plays the first N turns (`method.student_turns`, N drawn per episode
  from [student_turns_min, student_turns] unless that is None), the teacher takes over the
  following turns (each at most `method.teacher_max_tokens`) until the episode ends or the turn
  budget; CE only on the teacher's turns (mask 1); environment text and the student's turns are
  mask 0.
- OPD: the live student plays the whole episode; the teacher scores every student turn in the
  same context (the same token ids); per token A_t = coef * (logp_teacher - logp_student),
  on-policy policy gradient on student-turn tokens only (environment tokens masked).

Both run on the online trainer ROSE shares (online.py): a batch of item indices becomes a batch
of episodes inside `training_step`. Episodes are in the student's tokens; a teacher of another
tokenizer family writes its ROSE turns through `BridgedAgent` (turn by turn re-encoding); OPD
needs one tokenizer (the teacher scores the student's own ids).
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from distill.config import OPDMethod, ROSEMethod
from distill.episodes.data import BridgedAgent, episode_example, episode_stats, writer_turns
from distill.episodes.episode import frame_for
from distill.episodes.play import EngineAgent, Policy, handover, play, single
from distill.episodes.protocol import as_episodic
from distill.methods.budget import teacher_turns
from distill.methods.callbacks import DistillCallback
from distill.methods.online import CECallback, OnlineTrainer, collate, run_online

if TYPE_CHECKING:
    import torch

    from distill.engines.hf import HFEngine
    from distill.episodes.episode import Episode
    from distill.methods.context import RunContext


def same_tokenizer(ctx: RunContext) -> bool:
    return bool(ctx.student.tokenizer.get_vocab() == ctx.teacher.tokenizer.get_vocab())


def student_turns_for(method: ROSEMethod, rng: random.Random) -> Any:
    """N per episode: fixed `student_turns`, or drawn from [student_turns_min, student_turns]."""
    low = method.student_turns_min
    drawn: dict[int, int] = {}

    def pick(ep: Episode) -> int:
        if low is None:
            return method.student_turns
        return drawn.setdefault(ep.uid, rng.randint(low, method.student_turns))

    return pick


def play_batch(ctx: RunContext, engine: HFEngine, items: list[Any], rng: random.Random) -> list[Episode]:
    """This step's episodes: the live student alone (OPD), or handing over to the teacher (ROSE)."""
    cfg = ctx.config
    domain = as_episodic(ctx.domain)
    student = EngineAgent(
        engine,
        "student",
        cfg.rollout.max_new_tokens,
        cfg.rollout.temperature,
        cfg.rollout.top_p,
        cfg.eval.batch_size,
    )
    policy: Policy = single(student)
    if isinstance(cfg.method, ROSEMethod):
        method = cfg.method
        teacher: Any = EngineAgent(
            ctx.teacher,
            "teacher",
            method.teacher_max_tokens,
            method.teacher_temperature,
            1.0,
            cfg.eval.batch_size,
        )
        if not same_tokenizer(ctx):
            teacher = BridgedAgent(teacher, domain.script)
        policy = handover(student, teacher, student_turns_for(method, rng))
    tokenizer = ctx.student.tokenizer
    return play(domain, items, policy, tokenizer, frame_for(tokenizer, ctx.student.enable_thinking))


def opd_loss(
    model: Any, ctx: RunContext, episodes: list[Episode], coef: float, clip: float | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """OPD over the student's turns of whole episodes: `method.loss` token_reward_direct
    (sampled-token advantages, on-policy so the ratio is 1) or forward_kl_topk."""
    import torch

    rows = [ep for ep in episodes if not ep.failed and any(ep.mask({"student"}))]
    if not rows:
        raise ValueError("opd: no episode of this step has a student turn to train on")
    if ctx.method_as(OPDMethod).loss == "forward_kl_topk":
        return _topk_loss(model, ctx, rows)
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

    method = ctx.method_as(OPDMethod)
    k, tail = method.top_k, method.topk_tail
    batch = collate([(ep.ids, ep.ids) for ep in rows], ctx.student.tokenizer.pad_token_id)
    ids, attn = batch["input_ids"], batch["attention_mask"]
    mask_B_T = torch.zeros(ids.shape[0], ids.shape[1] - 1)
    for i, ep in enumerate(rows):
        mask_B_T[i, : len(ep.ids) - 1] = torch.tensor(ep.mask({"student"})[1:], dtype=torch.float32)
    with torch.no_grad():
        teacher_lp = torch.log_softmax(
            ctx.local_teacher().model(input_ids=ids, attention_mask=attn).logits.float()[:, :-1], -1
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


class EpisodeTrainer(OnlineTrainer):
    """Each micro-batch: a batch of episodes from the live student, then ROSE's CE on the
    teacher's turns or OPD's loss on the student's."""

    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        ctx = self.distill_ctx
        cfg = ctx.config
        domain = as_episodic(ctx.domain)
        step = self.state.global_step
        self.begin_micro_batch()
        items = self.step_items(inputs)
        engine = self.live_engine()
        t0 = time.perf_counter()
        was_training = engine.model.training
        engine.model.eval()
        episodes = play_batch(ctx, engine, items, self.step_rng(per_micro_batch=False))
        if was_training:
            engine.model.train()
        t1 = time.perf_counter()
        if isinstance(cfg.method, ROSEMethod):
            loss, extra = self._rose_loss(model, episodes, cfg.method)
        else:
            model.train()
            method = ctx.method_as(OPDMethod)
            raw, extra = opd_loss(model, ctx, episodes, method.coef, method.advantage_clip)
            self.accelerator.backward(raw / self.args.gradient_accumulation_steps)
            loss = raw.detach()
        t2 = time.perf_counter()
        lengths, truncated = writer_turns(episodes, "student")
        ctx.log.add(
            {
                **episode_stats(episodes, domain),
                **extra,
                "perf/gen_time_s": t1 - t0,
                "perf/train_time_s": t2 - t1,
                "student/completion_tokens_mean": sum(lengths) / max(len(lengths), 1),
                "student/completion_tokens_max": float(max(lengths, default=0)),
                "student/truncation_rate": sum(truncated) / max(len(truncated), 1),
                "_tokens": float(sum(len(ep.ids) for ep in episodes)),
            }
        )
        ctx.log.samples(step + 1, [ep.record(domain) for ep in episodes[: cfg.tracking.sample_rows]])
        return loss

    def _rose_loss(
        self, model: Any, episodes: list[Episode], method: ROSEMethod
    ) -> tuple[torch.Tensor, dict[str, float]]:
        ok = [ep for ep in episodes if not ep.failed]
        examples = [episode_example(ep, ["teacher"]) for ep in ok if sum(ep.mask({"teacher"}))]
        if not examples:
            raise ValueError(
                f"rose: no episode of step {self.state.global_step + 1} reached a teacher turn (all ended "
                "within the student's turns); lower method.student_turns"
            )
        return self.ce_step(model, examples), teacher_turns(episodes, method.teacher_max_tokens)


def train(ctx: RunContext) -> None:
    """Train the student online on episodes: ROSE or OPD, by the run's method."""
    cfg = ctx.config
    if isinstance(cfg.method, OPDMethod) and not same_tokenizer(ctx):
        raise ValueError(
            f"opd on {cfg.domain.name} scores the student's own tokens: student and teacher must share a "
            f"tokenizer ({cfg.student.name} and {cfg.teacher.name} differ); rose and sft bridge "
            "tokenizers turn by turn"
        )
    callback = CECallback(ctx) if isinstance(cfg.method, ROSEMethod) else DistillCallback(ctx)
    run_online(ctx, EpisodeTrainer, callback)


# Registry entries (registry.py): one per method word, so a run's method names its code.
train_rose = train
train_opd = train
