"""Online multi-turn distillation on an episodic domain: ROSE and OPD, turn by turn.

- ROSE: the live student plays the first N turns (`method.student_turns`, N drawn per episode
  from [student_turns_min, student_turns] unless that is None), the teacher takes over the
  following turns (each at most `method.teacher_max_tokens`) until the episode ends or the turn
  budget; CE only on the teacher's turns (mask 1); environment text and the student's turns are
  mask 0.
- OPD: the live student plays the whole episode; the teacher scores every student turn in the
  same context (the same token ids); per token A_t = coef * (logp_teacher - logp_student),
  on-policy policy gradient on student-turn tokens only (environment tokens masked).
- OPSD: OPD with the student's own weights (step-0, live or EMA) as the teacher, which scores
  every turn in its privileged view: the first user message carries the task's privileged
  context (SciWorld: the gold plan) through `method.teacher_template`, so the teacher sees it at
  every turn; the student never does.

Both run on the online trainer ROSE shares (online.py): a batch of item indices becomes a batch
of episodes inside `training_step`. Episodes are in the student's tokens; a teacher of another
tokenizer family writes its ROSE turns through `BridgedAgent` (the tokenizer bridge, turn by
turn; an episode with a lossy seam is left out of the loss, `teacher/seam_failure_rate`), and
its budget figures count its own tokens; OPD needs one tokenizer (the teacher scores the
student's own ids). Every draw of a micro-batch (N per episode, sampled tokens) is seeded by
(run seed, step, micro-batch index): micro-batches differ, and a resumed run draws what the
uninterrupted run drew.
"""

from __future__ import annotations

import hashlib
import random
import time
from typing import TYPE_CHECKING, Any, cast

import torch

from distill.config import OnPolicyKL, OPDMethod, OPSDMethod, ROSEMethod
from distill.engines.base import right_pad
from distill.episodes.data import (
    BridgedAgent,
    episode_example,
    episode_stats,
    seam_failure_rate,
    writer_turns,
)
from distill.episodes.episode import frame_for
from distill.episodes.play import EngineAgent, Policy, handover, play, single
from distill.episodes.protocol import as_episodic
from distill.kernels import losses
from distill.kernels.heads import head_gather, head_gather_topk, select_positions
from distill.kernels.sharded import full_weights, head_call
from distill.kernels.states import decoder_states
from distill.launch import rank, summed, token_share, world_size
from distill.methods.budget import teacher_turns
from distill.methods.callbacks import DistillCallback
from distill.methods.online import CECallback, OnlineTrainer, run_online
from distill.methods.privileged import setup_teacher
from distill.methods.scoring import kl_stats
from distill.methods.views import teacher_message
from distill.tokenizer_bridge.bridge import TokenizerBridge

if TYPE_CHECKING:
    from distill.domains.base import Item
    from distill.engines.base import TokenScores
    from distill.engines.hf import HFEngine
    from distill.episodes.episode import Episode
    from distill.methods.context import RunContext


def same_tokenizer(ctx: RunContext) -> bool:
    return bool(ctx.student.tokenizer.get_vocab() == ctx.teacher.tokenizer.get_vocab())


def micro_batch_seed(seed: int, step: int, micro: int) -> int:
    """The seed of one micro-batch's draws, a function of (run seed, optimizer step, micro-batch
    index) only: every gradient-accumulation micro-batch draws its own stream, and a run resumed
    at step s draws exactly what the uninterrupted run drew there."""
    digest = hashlib.sha256(f"distill-episodes:{seed}:{step}:{micro}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # < 2**63: torch.manual_seed takes it


def student_turns_for(method: ROSEMethod, rng: random.Random, count: int) -> Any:
    """N per episode: fixed `student_turns`, or drawn from [student_turns_min, student_turns],
    one draw per item position in order (not in the order the environments start episodes). The
    draws are the whole step's, of which process r plays the r-th of equal slices (as the data
    loader splits the items): each episode gets the N one process would give it."""
    low = method.student_turns_min
    first = rank() * count
    drawn = [
        method.student_turns if low is None else rng.randint(low, method.student_turns)
        for _ in range(first + count)
    ]

    def pick(ep: Episode) -> int:
        return drawn[first + ep.position]

    return pick


def play_batch(ctx: RunContext, engine: HFEngine, items: list[Any], rng: random.Random) -> list[Episode]:
    """This step's episodes: the live student alone (OPD), or handing over to the teacher (ROSE)."""
    cfg = ctx.config
    domain = as_episodic(ctx.domain)
    student = EngineAgent(engine, "student", cfg.rollout.sampling(), cfg.eval.batch_size)
    policy: Policy = single(student)
    if isinstance(cfg.method, ROSEMethod):
        method = cfg.method
        teacher: Any = EngineAgent(ctx.teacher, "teacher", cfg.teacher_sampling(), cfg.eval.batch_size)
        if not same_tokenizer(ctx):
            bridge = TokenizerBridge(ctx.student.tokenizer, ctx.teacher.tokenizer)
            teacher = BridgedAgent(teacher, domain.script, bridge, domain.turn_end)
        policy = handover(student, teacher, student_turns_for(method, rng, len(items)))
    tokenizer = ctx.student.tokenizer
    return play(domain, items, policy, tokenizer, frame_for(tokenizer, ctx.student.enable_thinking))


def seeded_play(ctx: RunContext, engine: HFEngine, items: list[Any], seed: int) -> list[Episode]:
    """`play_batch` with every draw seeded by `seed`: the N per episode (Python) and the
    student's and teacher's sampled tokens (torch's generator, forked so the training step's own
    stream, e.g. dropout, is left as it was)."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return play_batch(ctx, engine, items, random.Random(seed))


def scored_rows(ctx: RunContext, episodes: list[Episode]) -> tuple[list[Episode], TokenScores]:
    """The episodes OPD trains on (a student turn, not failed) and the teacher's scores of them
    (an engine call: a served teacher works too)."""
    rows = [ep for ep in episodes if not ep.failed and any(ep.mask({"student"}))]
    if not rows:
        raise ValueError(f"{ctx.config.method.name}: no episode of this step has a student turn to train on")
    method = ctx.method_as(OnPolicyKL)
    return rows, _teacher_scores(ctx, rows, method.top_k if method.loss == "forward_kl_topk" else 0)


def opd_loss(
    model: Any, ctx: RunContext, rows: list[Episode], teacher: TokenScores, coef: float, clip: float | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """OPD over the student's turns of whole episodes (`scored_rows`): `method.loss`
    token_reward_direct (sampled-token advantages, on-policy so the ratio is 1) or forward_kl_topk.
    The teacher scored the same ids; the student's head is applied per chunk of its turn
    positions (kernels/heads.py)."""
    method = ctx.method_as(OnPolicyKL)
    top_k = method.top_k if method.loss == "forward_kl_topk" else 0
    pad = int(ctx.student.tokenizer.pad_token_id)
    ids_B_L, attn_B_L = right_pad([ep.ids for ep in rows], pad)
    device = ctx.student.model.device
    ids_B_L, attn_B_L = ids_B_L.to(device), attn_B_L.to(device)
    turns_B_T, _ = right_pad([ep.mask({"student"})[1:] for ep in rows], 0, ids_B_L.shape[1] - 1)
    turns_B_T = turns_B_T.bool().to(device)
    hidden_N_H = select_positions(decoder_states(model, ids_B_L, attn_B_L)[:, :-1], turns_B_T)
    targets_N = ids_B_L[:, 1:][turns_B_T]
    teacher = teacher.widened(turns_B_T.shape[1]).to(device)
    # Several processes: each one's token mean, rescaled so that their average is the mean over
    # all of their tokens (launch.token_share).
    share = token_share(hidden_N_H.shape[0], device)
    teacher_ids_N_K, teacher_logps_N_K = (t[turns_B_T] for t in teacher.topk()) if top_k else (None, None)

    def head_pass(
        h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, ...]:
        if teacher_ids_N_K is None:
            return head_gather(h, weight, bias, targets_N[:, None])
        return head_gather_topk(h, weight, bias, torch.cat([targets_N[:, None], teacher_ids_N_K], 1), top_k)[
            :3
        ]

    # The head whole for the pass, gathered once when the student is sharded (kernels/sharded.py).
    gathered_N_K, lse_N, *own = head_call(model, head_pass, hidden_N_H)
    logp_S_N = gathered_N_K[:, 0] - lse_N
    gap_N = teacher.logprobs_B_T[turns_B_T] - logp_S_N.detach()
    if teacher_ids_N_K is not None and teacher_logps_N_K is not None:
        logq_N_K = gathered_N_K[:, 1:] - lse_N[:, None]
        kl_N = losses.topk_forward_kl_per_token(logq_N_K, teacher_logps_N_K, method.topk_tail)
        with torch.no_grad():
            figures = {
                "kl/topk_overlap": losses.topk_overlap(own[0], teacher_ids_N_K),
                "kl/student_topk_mass": float(logq_N_K.exp().sum(-1).mean()) if len(logq_N_K) else 0.0,
                "kl/teacher_topk_mass": float(teacher_logps_N_K.exp().sum(-1).mean())
                if len(teacher_logps_N_K)
                else 0.0,
            }
        return kl_N.mean() * share, {**kl_stats(-gap_N), **figures}
    adv_N = coef * gap_N if clip is None else (coef * gap_N).clamp(-clip, clip)
    loss = -(adv_N * logp_S_N).sum() / max(logp_S_N.numel(), 1) * share
    stats = kl_stats(-gap_N, coef * gap_N.mean())
    if clip is not None:
        stats["kl/clip_share"] = float(((coef * gap_N).abs() > clip).float().mean()) if len(gap_N) else 0.0
    return loss, stats


def _teacher_scores(ctx: RunContext, rows: list[Episode], top_k: int) -> TokenScores:
    """The teacher's scores of every episode token after the first, in the layout of `ids[1:]`
    (position t is predicted by the state at t). OPD's teacher reads the same ids; OPSD's reads
    its privileged view: the first user message rewritten by `method.teacher_template` around the
    task's privileged context (SciWorld: the gold plan), every later token the same."""
    if not isinstance(ctx.config.method, OPSDMethod):
        return ctx.teacher.score([ep.ids[:1] for ep in rows], [ep.ids[1:] for ep in rows], top_k=top_k)
    method, domain = ctx.config.method, ctx.domain
    # The episodes were played from the run's training items (Items behind the Task protocol).
    items = [cast("Item", ep.item) for ep in rows]
    if method.privileged_every_turn:
        turned = [
            ep.privileged_view(domain.privileged_context(item)) for ep, item in zip(rows, items, strict=True)
        ]
        scores = ctx.teacher.score([v[:1] for v, _ in turned], [v[1:] for v, _ in turned], top_k=top_k)
        # ids[t] sits at view position where[t], scored at where[t] - 1 of the view[1:] layout.
        index = [[w - 1 for w in where[1:]] for _, where in turned]
        return scores.gathered(index, max(len(ep.ids) for ep in rows) - 1)
    views = [
        ep.privileged_prompt(teacher_message(method, domain, item, ep.first_message))
        for ep, item in zip(rows, items, strict=True)
    ]
    scores = ctx.teacher.score(
        [v for v, _ in views], [ep.ids[end:] for ep, (_, end) in zip(rows, views, strict=True)], top_k=top_k
    )
    # The suffix ids[end:] sits at positions end-1.. of the ids[1:] layout.
    return scores.placed([end - 1 for _, end in views], max(len(ep.ids) for ep in rows) - 1)


class EpisodeTrainer(OnlineTrainer):
    """Each micro-batch: a batch of episodes from the live student, then ROSE's CE on the
    teacher's turns or OPD's loss on the student's. The step's figures cover all its
    micro-batches."""

    _episodes: list[Episode]
    _times: dict[str, float]

    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        ctx = self.distill_ctx
        cfg = ctx.config
        domain = as_episodic(ctx.domain)
        step = self.state.global_step
        if self.begin_micro_batch():
            self._episodes, self._times = [], {"perf/gen_time_s": 0.0, "perf/train_time_s": 0.0}
        items = self.step_items(inputs)
        engine = self.live_engine()
        t0 = time.perf_counter()
        was_training = engine.model.training
        engine.model.eval()
        # A sharded student is whole on every rank for its episodes and the scores it gives
        # itself (OPSD's live teacher): each rank's forwards are its own (kernels/sharded.py).
        with full_weights(engine.model):
            episodes = seeded_play(ctx, engine, items, micro_batch_seed(cfg.seed, step, self.micro.index))
            scored = None if isinstance(cfg.method, ROSEMethod) else scored_rows(ctx, episodes)
        if was_training:
            engine.model.train()
        t1 = time.perf_counter()
        if scored is None:
            loss = self._rose_loss(model, episodes)
        else:
            model.train()
            method = ctx.method_as(OnPolicyKL)
            raw, extra = opd_loss(model, ctx, *scored, method.coef, method.advantage_clip)
            self.accelerator.backward(raw / self.args.gradient_accumulation_steps)
            loss = raw.detach()
            ctx.log.add(extra)
        t2 = time.perf_counter()
        self._episodes.extend(episodes)
        self._times["perf/gen_time_s"] += t1 - t0
        self._times["perf/train_time_s"] += t2 - t1
        ctx.log.add({**self._step_figures(domain), **self._times})
        ctx.log.samples(step + 1, [ep.record(domain) for ep in self._episodes[: cfg.tracking.sample_rows]])
        return loss

    def _step_figures(self, domain: Any) -> dict[str, float]:
        """The env/, student/ and (ROSE) teacher/ figures over this step's episodes so far."""
        cfg = self.distill_ctx.config
        episodes = self._episodes
        lengths, truncated = writer_turns(episodes, "student")
        stopped = [t.stopped for ep in episodes for t in ep.turns if t.writer == "student"]
        out = {
            **episode_stats(episodes, domain),
            "student/completion_tokens_mean": sum(lengths) / max(len(lengths), 1),
            "student/completion_tokens_max": float(max(lengths, default=0)),
            "student/truncation_rate": sum(truncated) / max(len(truncated), 1),
            # Turns that ran on past their action and were ended there (domain turn_end).
            "student/stopped_rate": sum(stopped) / max(len(stopped), 1),
            "_tokens": float(sum(len(ep.ids) for ep in episodes)),
        }
        if isinstance(cfg.method, ROSEMethod):
            # Budgets in the teacher's own tokens (its turn budget is counted in them).
            out.update(teacher_turns(episodes, cfg.method.teacher_max_tokens))
            if cfg.method.keep_verified_only:  # the share of episodes ROSE's CE kept
                kept = [_verified(ep, domain) for ep in episodes]
                out["teacher/kept_rate"] = sum(kept) / max(len(kept), 1)
            if any(t.source_tokens is not None for ep in episodes for t in ep.turns):  # bridged
                out["teacher/seam_failure_rate"] = seam_failure_rate(episodes)
        return out

    def _rose_loss(self, model: Any, episodes: list[Episode]) -> torch.Tensor:
        """CE on the teacher's turns of this process's episodes. With several processes the step's
        episodes are split over them: what is refused is judged over all of them, and a process
        left with nothing to learn from still runs the (zero) loss's forward and backward, whose
        collectives the others' wait for (DDP, FSDP2, ZeRO-3)."""
        ok = [ep for ep in episodes if not ep.failed and any(ep.mask({"teacher"}))]
        if not summed(len(ok), model.device):
            raise ValueError(
                f"rose: no episode of step {self.state.global_step + 1} reached a teacher turn (all ended "
                "within the student's turns); lower method.student_turns"
            )
        # A turn that crossed the tokenizer bridge lossily leaves its episode out of the loss.
        ok = [ep for ep in ok if ep.seam_ok]
        if not summed(len(ok), model.device):
            cfg = self.distill_ctx.config
            raise ValueError(
                f"rose: no episode of step {self.state.global_step + 1} crossed the tokenizer bridge "
                f"losslessly (`distill bridge check --student {cfg.student.name} --teacher {cfg.teacher.name}`)"
            )
        if self.distill_ctx.method_as(ROSEMethod).keep_verified_only:
            domain = as_episodic(self.distill_ctx.domain)
            ok = [ep for ep in ok if _verified(ep, domain)]
        if ok:
            return self.ce_step(model, [episode_example(ep, ["teacher"]) for ep in ok])
        if world_size() == 1:
            # No gradient this micro-step: the optimizer step leaves the weights as they are.
            return torch.zeros((), device=model.device)
        # An episode with no label: a loss of 0 and zero gradients, through every collective.
        return self.ce_step(model, [episode_example(episodes[0], [])])


def _verified(ep: Episode, domain: Any) -> bool:
    """An episode ROSE's CE keeps under `method.keep_verified_only`: a teacher turn to train on,
    crossed the bridge losslessly, ended in success."""
    return not ep.failed and ep.seam_ok and any(ep.mask({"teacher"})) and bool(domain.solved(ep.score))


def train(ctx: RunContext) -> None:
    """Train the student online on episodes: ROSE, OPD or OPSD, by the run's method."""
    cfg = ctx.config
    if isinstance(cfg.method, OPSDMethod):
        ctx.callbacks = [*ctx.callbacks, *setup_teacher(ctx)]  # the EMA teacher's, if any
    elif isinstance(cfg.method, OPDMethod) and not same_tokenizer(ctx):
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
train_opsd = train
