"""Preflight for on-policy methods: catch template, tokenisation and mask mistakes before step 1.

A public OPD reproduction trained for days against a teacher that saw a different chat template
than the student: every advantage was noise. These checks make that failure loud and early:

1. thinking mode: student and teacher render with the same `enable_thinking`;
2. templates: with a shared tokenizer (OPD), the teacher's rendered prompt is the student's;
3. zero advantage: the student scored through the trainer's prompt path and through the
   teacher's prompt path gives identical logprobs (so student = teacher means A_t = 0);
4. masks: only completion tokens carry a loss signal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from distill import registry
from distill.config import Sampling
from distill.methods.cross_family import crosses
from distill.methods.scoring import vocab_rows
from distill.methods.views import PromptFor, teacher_view, trainer_prompt_ids
from distill.tokenizer_bridge.align import aligned_share
from distill.tokenizer_bridge.bridge import TokenizerBridge, special_map_lines
from distill.tokenizer_bridge.granularity import align_sample, group_table

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.domains.base import Domain, Item
    from distill.engines.base import Engine
    from distill.tracking.rundir import RunDir

SELF_SCORE_TOLERANCE = 1e-4
SHOWN_TOKENS = 24


class PreflightError(ValueError):
    """A check failed: the message names the check and shows the evidence. `check` names it,
    `report` holds what ran up to it (None for the first-batch checks, which run in the trainer)."""

    check = "first batch"
    report: PreflightReport | None = None


@dataclass
class PreflightReport:
    side_by_side: str
    checks: list[tuple[str, str]] = field(default_factory=list)  # (name, outcome) of passed checks
    failed: tuple[str, str] | None = None  # (name, message) of the check that stopped the run
    # A check's measured number, passed or failed (teacher reference: max |delta logprob|, nats).
    values: dict[str, float] = field(default_factory=dict)

    def render(self) -> str:
        lines = [self.side_by_side, ""]
        lines += [f"  ok  {name}: {outcome}" for name, outcome in self.checks]
        if self.failed is not None:
            lines.append(f"  FAILED  {self.failed[0]}: {self.failed[1]}")
        return "\n".join(lines)

    def run(self, name: str, check: Callable[[], str]) -> None:
        """Run one check: its outcome is recorded, or its failure (then PreflightError goes on up,
        carrying this report)."""
        try:
            outcome = check()
        except PreflightError as exc:
            self.failed = (name, str(exc))
            exc.check, exc.report = name, self
            raise
        self.checks.append((name, outcome))

    def to_json(self) -> dict[str, Any]:
        """`preflight.json`: one entry per check with `ok`, the shape diagnose's `preflight_failed`
        rule reads (a check with `ok: false` is a finding)."""
        checks: dict[str, Any] = {_key(n): {"ok": True, "detail": o} for n, o in self.checks}
        if self.failed is not None:
            checks[_key(self.failed[0])] = {"ok": False, "detail": self.failed[1]}
        for name, value in self.values.items():
            checks[_key(name)]["value"] = value
        return {"checks": checks, "prompts": self.side_by_side}


def failure_entry(exc: PreflightError) -> tuple[str, dict[str, Any]]:
    """The `checks` entry of a failed check that has no report (a first-batch check)."""
    return _key(exc.check), {"ok": False, "detail": str(exc)}


def _key(name: str) -> str:
    return name.replace("-", "_").replace(" ", "_")


def head_tokens(engine: Engine, ids: Sequence[int], n: int = SHOWN_TOKENS) -> list[str]:
    return [str(engine.tokenizer.decode([i])) for i in list(ids)[:n]]


def side_by_side(left: tuple[str, list[str]], right: tuple[str, list[str]]) -> str:
    """Two token columns; rows where they differ are marked with `!`."""
    (l_name, l_toks), (r_name, r_toks) = left, right
    width = max([len(l_name)] + [len(repr(t)) for t in l_toks]) + 2
    lines = [f"    {l_name:<{width}}{r_name}"]
    for i in range(max(len(l_toks), len(r_toks))):
        a = repr(l_toks[i]) if i < len(l_toks) else ""
        b = repr(r_toks[i]) if i < len(r_toks) else ""
        mark = "!" if a != b else " "
        lines.append(f" {mark}{i:>2} {a:<{width}}{b}")
    return "\n".join(lines)


def prompt_table(student: Engine, student_ids: list[int], teacher: Engine, teacher_ids: list[int]) -> str:
    """Identical prompts in one line; otherwise the tokens around the first difference, side by side."""
    left = [str(student.tokenizer.decode([i])) for i in student_ids]
    right = [str(teacher.tokenizer.decode([i])) for i in teacher_ids]
    if left == right:
        return f"    student and teacher prompts are identical ({len(student_ids)} tokens)"
    first = next(
        (i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b), min(len(left), len(right))
    )
    start = max(0, first - 4)
    return f"    (from token {start})\n" + side_by_side(
        (f"student prompt ({len(student_ids)} tokens)", left[start : start + SHOWN_TOKENS]),
        (f"teacher prompt ({len(teacher_ids)} tokens)", right[start : start + SHOWN_TOKENS]),
    )


def check_thinking(config: RunConfig, student: Engine, teacher: Engine, item: Item) -> None:
    if config.student.enable_thinking == config.teacher.enable_thinking:
        return
    table = side_by_side(
        (
            f"student (enable_thinking={config.student.enable_thinking})",
            head_tokens(student, _tail(student, item)),
        ),
        (
            f"teacher (enable_thinking={config.teacher.enable_thinking})",
            head_tokens(teacher, _tail(teacher, item)),
        ),
    )
    raise PreflightError(
        "thinking mode differs: student.enable_thinking="
        f"{config.student.enable_thinking} but teacher.enable_thinking={config.teacher.enable_thinking}; "
        "set both to the same value. Last prompt tokens:\n" + table
    )


def _tail(engine: Engine, item: Item, n: int = 12) -> list[int]:
    return engine.prompt_ids(item.prompt)[-n:]


def self_score_gap(
    student: Engine,
    rollout_prompts: Sequence[Sequence[int]],
    teacher_prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
) -> float:
    """Max |logp| difference of the same completions under the two prompt paths, student weights."""
    a = student.score(rollout_prompts, completions)
    b = student.score(teacher_prompts, completions)
    gap_B_T = (a.logprobs_B_T - b.logprobs_B_T.to(a.logprobs_B_T.device)).abs()[a.mask_B_T]
    return float(gap_B_T.max()) if gap_B_T.numel() else 0.0


def check_loss_mask(
    prompt_ids_B_P: torch.Tensor,
    prompt_mask_B_P: torch.Tensor,
    completion_ids_B_T: torch.Tensor,
    completion_mask_B_T: torch.Tensor,
    advantages_B_T: torch.Tensor,
    prompt_rows: Sequence[Sequence[int]],
) -> None:
    """Only completion tokens carry signal: padding has zero advantage, prompts are not in the completion."""
    outside = advantages_B_T.float() * (1 - completion_mask_B_T.float())
    if outside.abs().max().item() > 0:
        raise PreflightError("loss mask: non-zero advantage on padding after the completion")
    if (prompt_mask_B_P.sum(1) == 0).any():
        raise PreflightError("loss mask: a rollout has an empty prompt")
    # Right-padded completions: the mask is a run of ones then zeros, never a hole.
    diffs = completion_mask_B_T[:, 1:].long() - completion_mask_B_T[:, :-1].long()
    if (diffs > 0).any():
        raise PreflightError("loss mask: completion mask has a gap (a masked token before an unmasked one)")
    for i, prompt in enumerate(prompt_rows):
        n = int(completion_mask_B_T[i].sum())
        head = completion_ids_B_T[i, : min(n, len(prompt))].tolist()
        if len(prompt) > 4 and head == list(prompt[: len(head)]) and len(head) == len(prompt):
            raise PreflightError(f"loss mask: rollout {i} repeats its prompt inside the completion")


def check_first_batch(
    student: Engine,
    out: dict[str, Any],
    items: Sequence[Item],
    prompt_rows: list[list[int]],
    completion_rows: list[list[int]],
) -> None:
    """On the trainer's real first batch: masks (the teacher's signal is zero off the completion),
    and its prompt ids equal the teacher path's."""
    check_loss_mask(
        out["prompt_ids"],
        out["prompt_mask"],
        out["completion_ids"],
        out["completion_mask"],
        out["teacher_logps"],
        prompt_rows,
    )
    gap = self_score_gap(
        student, prompt_rows, [student.prompt_ids(it.prompt) for it in items], completion_rows
    )
    if gap > SELF_SCORE_TOLERANCE:
        raise PreflightError(
            f"self-score on the first batch: the trainer's prompt ids and the teacher path's differ "
            f"(max logprob gap {gap:.3g} with the student as its own teacher)"
        )


def run_preflight(
    config: RunConfig,
    student: Engine,
    teacher: Engine,
    items: Sequence[Item],
    teacher_prompt: PromptFor,
    same_template_required: bool,
    max_new_tokens: int = 16,
) -> PreflightReport:
    """The checks that need no trainer; the mask check runs on the trainer's first real batch."""
    if not items:
        raise PreflightError("no items to check")
    item = items[0]
    student_ids = trainer_prompt_ids(student, item.prompt)
    teacher_ids = teacher_prompt(teacher, item)
    report = PreflightReport(prompt_table(student, student_ids, teacher, teacher_ids))

    def thinking() -> str:
        check_thinking(config, student, teacher, item)
        return f"student and teacher agree ({config.student.enable_thinking})"

    report.run("thinking mode", thinking)
    if same_template_required:
        report.run("chat template", lambda: _check_template(config, student, teacher, item, student_ids))
    report.run("self-score", lambda: _check_self_score(student, items, max_new_tokens))
    return report


def _check_template(
    config: RunConfig, student: Engine, teacher: Engine, item: Item, student_ids: list[int]
) -> str:
    plain = teacher.prompt_ids(item.prompt)
    if plain != student_ids:
        raise PreflightError(
            "chat templates differ: the teacher would score the student's tokens after a different prompt "
            f"({cfg_names(config)}). First tokens:\n"
            + side_by_side(
                ("student", head_tokens(student, student_ids)), ("teacher", head_tokens(teacher, plain))
            )
        )
    return "teacher renders the student's prompt token for token"


def _check_self_score(student: Engine, items: Sequence[Item], max_new_tokens: int) -> str:
    sample = list(items[: min(2, len(items))])
    rollout = [trainer_prompt_ids(student, it.prompt) for it in sample]
    completions = [c.ids for c in student.generate(rollout, Sampling(max_new_tokens))]
    # The teacher's prompt path, driven by the student's own weights: must reproduce the rollout's view.
    as_teacher = [student.prompt_ids(it.prompt) for it in sample]
    gap = self_score_gap(student, rollout, as_teacher, completions)
    if gap > SELF_SCORE_TOLERANCE:
        raise PreflightError(
            f"self-score: with the teacher set to the student, logprobs differ by up to {gap:.3g} "
            "(the trainer's prompt ids and the teacher's prompt ids are not the same tokens):\n"
            + side_by_side(
                ("rollout prompt", head_tokens(student, rollout[0])),
                ("teacher-path prompt", head_tokens(student, as_teacher[0])),
            )
        )
    return f"student as its own teacher: max |A_t| = {gap:.2e}"


def preflight_report(
    config: RunConfig,
    domain: Domain,
    student: Engine,
    teacher: Engine,
    run: RunDir | None = None,
    reference: Callable[[], Engine | None] | None = None,
    part: str | None = None,
) -> PreflightReport | None:
    """The pre-training checks of a run's method (None: nothing to check). `run` keeps the report,
    passed or failed, as `preflight.json` (diagnose's `preflight_failed` reads it). `reference`:
    loads the served teacher's weights here for the `teacher reference` check (None: no server).
    `part`: the domain of a run over several whose teacher this checks (its report goes under
    `parts.<part>`, beside the other domains')."""
    view = teacher_view(config, domain)
    if not config.preflight or view is None:
        return None
    items = domain.train_items()[:2]
    # Cross-family OPD renders the teacher's own template by design (methods/cross_family.py).
    cross = crosses(config, student, teacher)
    try:
        report = run_preflight(
            config, student, teacher, items, view.prompt_for, view.same_template and not cross
        )
        if registry.method_entry(config.method.name).teacher == "scores":
            report.run("vocabulary", lambda: vocabulary(student, teacher, cross))
        if reference is not None:
            report.run(
                "teacher reference", lambda: reference_check(teacher, reference(), student, items, report)
            )
        if cross:
            report.run("aligned groups", lambda: aligned_groups(student, teacher, items[0]))
    except PreflightError as exc:
        if run is not None and exc.report is not None:
            keep_report(run, exc.report, part)
        raise
    if run is not None:
        keep_report(run, report, part)
    return report


def keep_report(run: RunDir, report: PreflightReport, part: str | None) -> None:
    """`preflight.json`: one domain's report as the file; in a run over several domains, each
    domain's under `parts.<domain>` (a domain checked later never replaces an earlier one's)."""
    if part is None:
        run.write_preflight(report.to_json())
        return
    kept = run.read_preflight()
    kept.setdefault("parts", {})[part] = report.to_json()
    run.write_preflight(kept)


def vocabulary(student: Engine, teacher: Engine, cross: bool) -> str:
    """Both models' head rows and tokenizer sizes, and what happens to ids outside what both have:
    rows beyond a tokenizer (Qwen3: 151,936 rows for 151,669 tokens) and a teacher with more rows
    than the student are normal; the run masks and counts what it cannot use."""
    s_rows, t_rows = vocab_rows(student), vocab_rows(teacher)
    s_tok, t_tok = len(student.tokenizer), len(teacher.tokenizer)
    sides = f"student {s_rows:,} rows / {s_tok:,} tokens, teacher {t_rows:,} rows / {t_tok:,} tokens"
    if cross:
        return (
            f"{sides}; sampled ids >= {s_tok:,} are masked (student/out_of_vocab_rate); the teacher's "
            "top-k reaches the student through the byte-level map, the rest goes to the tail bucket"
        )
    limit = min(s_tok, t_rows)
    return (
        f"{sides}; shared ids 0..{limit - 1:,}: sampled ids >= {limit:,} are masked "
        f"(student/out_of_vocab_rate), teacher top-k ids >= {s_rows:,} go to the tail bucket"
    )


# A reference pass loads the teacher's weights beside its server: only where they are small.
REFERENCE_MAX_BYTES = 2 * 2**30
# A gap this large (nats per token) means another model behind the endpoint: the run stops.
REFERENCE_REFUSE = 1.0


def reference_gap(scoring: Engine, reference: Engine, student: Engine, items: Sequence[Item]) -> float:
    """Max |logprob| difference between the teacher's scoring engine and a reference pass of the
    same model, on the student's greedy responses to `items` (scored after the teacher's prompt)."""
    prompts = [scoring.prompt_ids(item.prompt) for item in items]
    rollout = [trainer_prompt_ids(student, item.prompt) for item in items]
    completions = [c.ids for c in student.generate(rollout, Sampling(16))]
    a, b = scoring.score(prompts, completions), reference.score(prompts, completions)
    gap_B_T = (a.logprobs_B_T.cpu() - b.logprobs_B_T.cpu()).abs()[a.mask_B_T.cpu()]
    return float(gap_B_T.max()) if gap_B_T.numel() else 0.0


def reference_check(
    scoring: Engine,
    reference: Engine | None,
    student: Engine,
    items: Sequence[Item],
    report: PreflightReport | None = None,
) -> str:
    """The `teacher reference` check: a served teacher against its weights loaded here. The gap
    goes into `report`'s values (`preflight.json` `checks.teacher_reference.value`, what
    diagnose's `teacher_reference_gap` reads), passed or failed."""
    if reference is None:
        return f"skipped: the teacher's weights are not a local folder under {REFERENCE_MAX_BYTES / 2**30:.0f} GiB"
    gap = reference_gap(scoring, reference, student, items)
    if report is not None:
        report.values["teacher reference"] = gap
    if gap >= REFERENCE_REFUSE:
        raise PreflightError(
            f"teacher reference: the served teacher's logprobs differ from {reference_name(reference)} loaded "
            f"here by up to {gap:.3g} nats per token: another checkpoint, tokenizer or template behind the "
            "endpoint (serve teacher.name at the same revision and dtype)"
        )
    return f"max |delta logprob| {gap:.2e} (served vs in-process)"


def reference_name(engine: Engine) -> str:
    return str(engine.describe().get("path", "the teacher"))


def aligned_groups(student: Engine, teacher: Engine, item: Item, max_new_tokens: int = 24) -> str:
    """One real greedy sample of the student, cut into byte groups against the teacher's tokens,
    side by side (`*`: a group of more than one token on a side, where the signal is per group)."""
    prompt = trainer_prompt_ids(student, item.prompt)
    ids = student.generate([prompt], Sampling(max_new_tokens))[0].ids
    sample = align_sample(TokenizerBridge(student.tokenizer, teacher.tokenizer), ids)
    if not sample.ok:  # masked out in training, not fatal: bridge/seam_failure_rate counts them
        return f"the student's first sample is a seam failure ({sample.failure}); it is masked out"
    share = aligned_share(sample.groups)
    table = group_table(student.tokenizer, ids, teacher.tokenizer, sample.teacher_ids, sample.groups)
    specials = "\n".join(special_map_lines(TokenizerBridge(student.tokenizer, teacher.tokenizer)))
    groups = f"{len(sample.groups)} groups, {share:.0%} of student tokens in groups of <= 2 a side"
    return f"{groups}\n{table}\n  special tokens, by meaning:\n{specials}"


def cfg_names(config: RunConfig) -> str:
    return f"student {config.student.name}, teacher {config.teacher.name}"
