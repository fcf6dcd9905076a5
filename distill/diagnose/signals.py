"""Rules over the teacher's signal itself, from failure modes users of other toolkits hit:

- the student's probability mass on the teacher's top-k collapsing (verl's top-k reverse-KL
  instability: one way to shrink a truncated KL is to move the student's mass off the k tokens;
  verl PR 5041 dropped the loss after watching that mass fall), `kl/student_topk_mass` against
  `kl/teacher_topk_mass`;
- the advantage clamp (`method.advantage_clip`) binding on most tokens, `kl/clip_share`: the
  per-token signal becomes +-clip, its size is lost (verl's clamped top-k KL: 89% of steps
  clamped, RFC 7856);
- a served teacher's scoring engine disagreeing with an in-process reference pass of the same
  model: the preflight's `teacher_reference` check and the gap it measured before step 1,
  `preflight.json` `checks.teacher_reference.value` (vLLM vs transformers logprobs differ by up
  to ~0.3 nats in bf16, vllm #18352; a different checkpoint or tokenizer behind a served
  endpoint differs by nats on every token; SkyRL refuses to train on such a teacher);
- sampled token ids outside the tokenizer's vocabulary, `student/out_of_vocab_rate` (the padded
  rows of a Qwen head: vLLM #13175, NeMo-RL #237, rllm #751 dropped such trajectories).

Each rule is silent when its metric was not logged: a method logs the keys that apply to it.
"""

from __future__ import annotations

import math

import numpy as np

from distill.diagnose.eval_rules import lower_lr
from distill.diagnose.findings import Evidence, Finding, Fix, Severity, fmt, pct
from distill.diagnose.records import RunRecord, Series

# The student's share of the teacher's top-k mass (student mass / teacher mass) at the end below
# this fraction of where it started: the mass is leaving the teacher's tokens (warning), or nearly
# gone (error). Forward KL over the top-k pulls the share up on a healthy run.
TOPK_FALL_WARN, TOPK_FALL_ERROR = 0.5, 0.2
MIN_TOPK_POINTS = 5
# The clamp binding on more than this share of tokens in the median step.
CLIP_SHARE_WARN, CLIP_SHARE_ERROR = 0.5, 0.9
# Max |delta logprob| between the scoring engine and the reference pass, in nats: above ~0.3 is
# more than bf16 kernels explain (vllm #18352); e (1 nat) makes a token's probability 2.7x off,
# e^5 ~ 150x is a different model, tokenizer or prompt.
REFERENCE_GAP_WARN, REFERENCE_GAP_ERROR = 1.0, 5.0
# Out-of-vocabulary samples: any is noted; a tenth of a percent is more than a padded head's
# rounding (rllm #751: one id in ~30M tokens); a percent is a head trained or built wrong.
OOV_WARN, OOV_ERROR = 1e-3, 1e-2


def _aligned_ratio(s: Series, t: Series | None) -> Series:
    """The student's mass over the teacher's, on the steps both were logged (the student's alone
    without a teacher series)."""
    if t is None:
        return s
    # A step that scored no token (every sample masked, e.g. seam failures) logs neither mass
    # (methods/scoring.py KLMeter): it is not among the common steps. The teacher's mass on its
    # own top-k is never 0 where a token was scored: a 0 is no figure either, not a collapse.
    common, si, ti = np.intersect1d(s.steps, t.steps, return_indices=True)
    scored = t.values[ti] > 0
    ratio = s.values[si][scored] / t.values[ti][scored]
    return Series("student / teacher top-k mass", common[scored], ratio)


def topk_mass(rec: RunRecord) -> list[Finding]:
    s, t = rec.get("kl/student_topk_mass"), rec.get("kl/teacher_topk_mass")
    if s is None or len(s) < MIN_TOPK_POINTS:
        return []
    ratio = _aligned_ratio(s, t)
    if len(ratio) < MIN_TOPK_POINTS:
        return []
    head, tail = ratio.window(0.2, last=False), ratio.window(0.2, last=True)
    # Its start: the first step's share or the first 20% of steps' mean, whichever is higher (a
    # collapse can take the first updates: at lr 0.1 the share went 0.96 -> 0.21 in one step).
    r0, r1 = max(ratio.first(), head.mean()), tail.mean()
    if not (r0 > 0 and r1 <= TOPK_FALL_WARN * r0):
        return []
    severity = Severity.ERROR if r1 <= TOPK_FALL_ERROR * r0 else Severity.WARNING
    s0, s1 = s.window(0.2, last=False).mean(), s.window(0.2, last=True).mean()
    evidence = [
        Evidence(
            "kl/student_topk_mass",
            f"{fmt(s.first())}, {fmt(s0)} -> {fmt(s1)}",
            f"{head.span()} vs {tail.span()}",
            "first step, then window means",
        ),
    ]
    if t is not None:
        t0, t1 = t.window(0.2, last=False).mean(), t.window(0.2, last=True).mean()
        evidence.append(Evidence("kl/teacher_topk_mass", f"{fmt(t0)} -> {fmt(t1)}", note="the teacher's own"))
    evidence.append(Evidence(ratio.key, f"{pct(r0)} -> {pct(r1)}", note=f"{pct(r1 / r0)} of its start"))
    overlap = rec.get("kl/topk_overlap")
    if overlap is not None and len(overlap) >= 2:
        evidence.append(
            Evidence(
                "kl/topk_overlap",
                f"{fmt(overlap.window(0.2, last=False).mean())} -> {fmt(overlap.window(0.2, last=True).mean())}",
            )
        )
    fixes = list(lower_lr(rec))
    if rec.cfg("method.loss") == "forward_kl_topk" and rec.cfg("method.topk_tail") is False:
        fixes.insert(
            0, Fix("method.topk_tail", "true", "match the mass outside the top-k as one tail bucket")
        )
    return [
        Finding(
            name="topk_mass_collapse",
            severity=severity,
            title=f"the student's mass on the teacher's top-k collapsed: {pct(r0)} -> {pct(r1)} of the "
            "teacher's own",
            evidence=evidence,
            why="The top-k objective sees only the teacher's k tokens; a student that moves its mass "
            "off them shrinks a truncated divergence without learning the teacher (verl's top-k reverse KL "
            "was dropped for this). Once the mass is gone the student samples tokens the teacher never "
            "ranked, and the signal on them is noise.",
            fixes=fixes,
            advice="the forward KL already pulls the mass onto the teacher's tokens: the steps overshoot it; "
            "compare the eval before trusting this run"
            if rec.cfg("method.loss") == "forward_kl_topk"
            else "a forward KL over the teacher's top-k with its tail bucket (method.loss=forward_kl_topk) "
            "pulls the mass onto the teacher's tokens; compare the eval before trusting this run",
        )
    ]


def clamp_share(rec: RunRecord) -> list[Finding]:
    s = rec.get("kl/clip_share")
    if s is None or not len(s):
        return []
    median = s.median()
    if median < CLIP_SHARE_WARN:
        return []
    clip = rec.cfg("method.advantage_clip")
    steps_over = float(np.mean(s.values >= CLIP_SHARE_WARN))
    evidence = [
        Evidence("kl/clip_share", median, s.span(), "median share of completion tokens clamped"),
        Evidence("steps with most tokens clamped", pct(steps_over), s.span()),
    ]
    if isinstance(clip, int | float):
        evidence.append(Evidence("method.advantage_clip", float(clip)))
    spread = rec.get("kl/reverse_kl_std")
    coef = rec.cfg("method.coef", 1.0)
    fixes: list[Fix] = []
    if isinstance(clip, int | float):
        target = 4.0 * float(clip)
        if spread is not None and isinstance(coef, int | float):
            # Three standard deviations of the per-token advantage: the clamp then binds on outliers.
            evidence.append(
                Evidence("kl/reverse_kl_std", spread.median(), spread.span(), "median per-token spread")
            )
            target = max(target, 3.0 * abs(float(coef)) * spread.median())
        fixes.append(Fix("method.advantage_clip", f"{target:.2g}", "bind on the outliers only"))
        fixes.append(Fix("method.advantage_clip", "null", "or no clamp: the reference semantics"))
    return [
        Finding(
            name="clamp_saturated",
            severity=Severity.ERROR if median >= CLIP_SHARE_ERROR else Severity.WARNING,
            title=f"the advantage clamp binds on {pct(median)} of tokens in the median step"
            + (f" (method.advantage_clip={fmt(float(clip))})" if isinstance(clip, int | float) else ""),
            evidence=evidence,
            why="A clamped token's advantage is +-clip whatever the teacher thinks of it: with most tokens "
            "clamped, OPD's per-token signal keeps only its sign, and a token the teacher finds impossible "
            "weighs the same as one it mildly prefers.",
            fixes=fixes,
        )
    ]


def reference_gap(rec: RunRecord) -> list[Finding]:
    check = rec.preflight_check("teacher_reference")
    if check is None:
        return []  # no served teacher, or preflight off
    value = check.get("value")
    gap = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    failed = check.get("ok") is False
    if gap >= REFERENCE_GAP_ERROR:
        severity = Severity.ERROR
    elif gap >= REFERENCE_GAP_WARN or failed:
        severity = Severity.WARNING
    else:
        return []
    evidence = [
        Evidence(
            "preflight.json teacher_reference",
            "failed" if failed else "passed",
            note=str(check.get("detail", ""))[:300],
        )
    ]
    if math.isfinite(gap):
        evidence.append(
            Evidence("max |delta logprob|", gap, note="nats per token, scoring engine vs reference")
        )
    kl = rec.get("kl/reverse_kl_mean")
    if kl is not None:
        evidence.append(
            Evidence("kl/reverse_kl_mean", kl.first(), f"step {int(kl.steps[0])}", "the signal's size")
        )
    engine = rec.cfg("teacher.engine", "hf")
    where = f"teacher.engine={engine}" + (f" at {rec.cfg('teacher.url')}" if rec.cfg("teacher.url") else "")
    evidence.append(Evidence("scoring engine", where))
    return [
        Finding(
            name="teacher_reference_gap",
            severity=severity,
            title=f"the teacher's scoring engine disagrees with a reference pass of the same model by up to "
            f"{fmt(gap)} nats per token"
            if math.isfinite(gap)
            else "the teacher's scoring engine disagrees with its reference pass (preflight)",
            evidence=evidence,
            why="The per-token signal is logp_teacher - logp_student: a scoring engine that is off by more "
            "than the signal itself trains the student toward the engine's error. Precision alone moves "
            "logprobs by tenths of a nat; nats mean another checkpoint, tokenizer, chat template or "
            "sampling-processed logprobs behind the endpoint.",
            advice="check that the served model is teacher.name at the same revision and dtype, that the "
            "server returns raw (not temperature-processed) logprobs, and that it tokenizes nothing itself "
            "(ids in, logprobs out); `distill serve teacher` serves teacher.name as configured",
        )
    ]


def out_of_vocab(rec: RunRecord) -> list[Finding]:
    s = rec.get("student/out_of_vocab_rate")
    if s is None or not len(s) or s.max() <= 0:
        return []
    rate, worst = s.mean(), s.max()
    if rate >= OOV_ERROR:
        severity = Severity.ERROR
    elif rate >= OOV_WARN:
        severity = Severity.WARNING
    else:
        severity = Severity.INFO
    head, tail = s.window(0.2, last=False), s.window(0.2, last=True)
    evidence = [
        Evidence("student/out_of_vocab_rate", rate, s.span(), f"mean; worst step {pct(worst)}"),
        Evidence(
            "start -> end", f"{fmt(head.mean())} -> {fmt(tail.mean())}", f"{head.span()} vs {tail.span()}"
        ),
        Evidence("steps with any", pct(float(np.mean(s.values > 0))), s.span()),
    ]
    vocab = rec.manifest.get("models", {}).get("student", {}).get("vocab")
    if vocab:
        evidence.append(Evidence("manifest models.student.vocab", vocab))
    fixes = []
    top_p = rec.cfg("rollout.top_p", 1.0)
    if severity > Severity.INFO and isinstance(top_p, int | float) and top_p >= 1.0:
        fixes.append(Fix("rollout.top_p", "0.99", "sample from the nucleus: the padded rows sit in the tail"))
    return [
        Finding(
            name="out_of_vocab",
            severity=severity,
            title=f"{pct(rate)} of sampled tokens are ids outside the tokenizer's vocabulary (masked from the loss)",
            evidence=evidence,
            why="The student's output head has rows no tokenizer id names (padding to a multiple of 64 or "
            "128); a sample that lands there has no text, and is masked from the loss. Rare is harmless; "
            "frequent means the head gives those rows real mass, and the masked tokens take their samples "
            "out of training.",
            fixes=fixes,
            advice="resize the head to the tokenizer (`model.resize_token_embeddings(len(tokenizer))`) or "
            "give the padded rows -inf bias"
            if severity > Severity.INFO
            else "",
        )
    ]
