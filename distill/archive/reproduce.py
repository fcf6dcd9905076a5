"""`distill reproduce <run>`: re-create a run from its manifest and say whether its numbers match.

Full mode (`prepare_rerun`, run by the caller through `runner.execute`) re-runs training with the manifest's resolved config (same seed, same data, same
models) as a new run `<run>-repro-<hex>` and compares every eval figure of the two summaries.
`--eval-only` loads the run's final checkpoint (e.g. after `distill archive pull`; a LoRA run's
holds adapters only) and repeats the final eval only, each domain of a mixed run on its own items
as the run did, compared part by part. A figure the original recorded and the reproduction lacks
is a mismatch. Both compare exactly: greedy eval on CPU is deterministic, so any difference is a
real one (other package versions, thread counts, or drifted files), and the notes name the
differences in environment the manifest shows. A full re-run is refused (exit 2) when the models
it would start from are not the ones the manifest pins (weights, tokenizer or chat template: a
rebuilt zoo, a moved hub revision, an edited local folder; in a run over several domains, every
domain's teacher, `teacher@<domain>`): that re-run would not be this run.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill import registry
from distill.archive.dvcrepo import ArchiveError
from distill.archive.manifest import git_diff, package_versions, read_manifest, start_differences, start_pins
from distill.config import ConfigError, RunConfig
from distill.domains import build_domain
from distill.engines.hf import HFEngine
from distill.engines.placement import place, this_machine
from distill.run_eval import eval_parts, evaluate_parts
from distill.settings import get_settings
from distill.tracking.mlflow import git_tags
from distill.tracking.rundir import RunDir
from distill.zoo import resolve_model
from distill.zoo.check import MODEL_FILES

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.evals.single_turn import EvalResult

Say = Any  # a callable(str) that prints for the user
SECTIONS = ("student_before", "teacher_score", "student_after")
# Wall-clock figures an eval records beside its results (the agent eval's `episodes_per_min`,
# `env_step_time_s`): they measure the machine's load, not the model, and never repeat exactly.
TIMING_SUFFIXES = ("_time_s", "_seconds", "per_min", "per_s")


@dataclass(frozen=True)
class Comparison:
    section: str
    metric: str
    original: float
    reproduced: float
    # The original recorded the figure and the reproduction did not make it.
    missing: bool = False

    @property
    def match(self) -> bool:
        if self.missing:
            return False
        both_nan = math.isnan(self.original) and math.isnan(self.reproduced)
        return both_nan or self.original == self.reproduced


@dataclass
class Reproduction:
    run_id: str
    # The new run's id; None for --eval-only.
    new_run_id: str | None
    comparisons: list[Comparison]
    notes: list[str]

    @property
    def match(self) -> bool:
        return bool(self.comparisons) and all(c.match for c in self.comparisons)


def compare_summaries(
    original: dict[str, Any], reproduced: dict[str, Any], sections: tuple[str, ...] = SECTIONS
) -> list[Comparison]:
    """Every recorded figure of `sections`, in the whole run and in each domain of a mixed run
    (`parts`, shown as `<section> [<domain>]`), against the reproduction's; one the reproduction
    lacks is a mismatch (`missing`)."""
    pairs = [(section, original.get(section), reproduced.get(section)) for section in sections]
    for part, scores in (original.get("parts") or {}).items():
        again = (reproduced.get("parts") or {}).get(part) or {}
        pairs += [(f"{section} [{part}]", scores.get(section), again.get(section)) for section in sections]
    out = []
    for section, before, after in pairs:
        if not isinstance(before, dict):
            continue
        after = after if isinstance(after, dict) else {}
        for metric in sorted(before):
            a, b = before[metric], after.get(metric)
            if metric.endswith(TIMING_SUFFIXES) or not isinstance(a, int | float):
                continue
            if isinstance(b, int | float):
                out.append(Comparison(section, metric, float(a), float(b)))
            else:
                out.append(Comparison(section, metric, float(a), math.nan, missing=True))
    return out


def environment_notes(manifest: dict[str, Any], config: RunConfig) -> list[str]:
    """What differs from the recorded environment and can change numbers."""
    import torch

    notes = []
    recorded = manifest.get("packages", {})
    current = package_versions()
    for name in sorted(recorded.keys() & current.keys()):
        if recorded[name] != current[name]:
            notes.append(f"{name} {recorded[name]} then, {current[name]} now")
    threads = manifest.get("hardware", {}).get("torch_threads")
    now = config.threads or torch.get_num_threads()
    if isinstance(threads, int) and threads != now:
        notes.append(f"torch threads {threads} then, {now} now (set `threads` in the config to pin it)")
    then_git, git = manifest.get("git", {}), git_tags()
    if then_git.get("sha") not in (None, "unknown") and then_git.get("sha") != git.get("git.sha"):
        notes.append(f"git commit {str(then_git['sha'])[:12]} then, {str(git.get('git.sha'))[:12]} now")
    then_diff, now_diff = then_git.get("diff_md5"), git_diff(git.get("git.dirty")).get("diff_md5")
    if (then_diff or now_diff) and then_diff != now_diff:
        notes.append(
            f"uncommitted changes differ (diff md5 {_short(then_diff)} then, {_short(now_diff)} now; "
            "the recorded diff is in manifest.json under git.diff)"
        )
    return notes


def _short(value: Any) -> str:
    return str(value)[:12] if value else "none"


def current_start(config: RunConfig) -> dict[str, dict[str, Any]]:
    """The pins of the models `config` names as they are here now (zoo models built if missing,
    as the re-run would): the student, and the teacher, or in a run over several domains each
    domain's (`teacher@<domain>`, and `teacher`: the first domain's, as the manifest records)."""
    from transformers import AutoTokenizer

    settings = get_settings()
    parts = registry.domain_parts(config.domain.name)
    own = registry.method_entry(config.method.name).own_teacher
    roles: dict[str, tuple[str, str | None]] = {"student": (config.student.name, None)}
    if len(parts) == 1:
        roles["teacher"] = (config.teacher.name, None)
    else:
        # As the run loaded them (prepare.load_teachers): a zoo teacher is its domain's own.
        roles.update({f"teacher@{p}": (config.teacher_of(p).name, None if own else p) for p in parts})
        roles["teacher"] = roles[f"teacher@{parts[0]}"]
    resolved: dict[tuple[str, str | None], tuple[str, str | None]] = {}
    for name, part in roles.values():
        if (name, part) in resolved:
            continue
        path = resolve_model(name, config.domain, settings, part=part)
        try:
            template = AutoTokenizer.from_pretrained(path).chat_template
        except (OSError, ValueError):  # a hub model not downloaded here: unpinned, said in a note
            template = None
        resolved[(name, part)] = (path, template)
    return start_pins({role: resolved[key] for role, key in roles.items()})


def check_start(manifest: dict[str, Any], config: RunConfig, run_id: str) -> list[str]:
    """Refuse (ArchiveError) when the starting weights, tokenizer or chat template differ from the
    manifest's pins; the notes for what could not be checked."""
    recorded = manifest.get("start")
    if not isinstance(recorded, dict):
        return [
            "the manifest pins no starting weights (a run from before distill recorded them): not checked"
        ]
    current = current_start(config)
    notes = []
    for role, pin in list(current.items()):
        if pin.get("source") == "hub" and pin.get("revision") is None:
            notes.append(
                f"{role} {pin['path']} is not in the local Hugging Face cache: its revision is not checked"
            )
            del current[role]
    differences = start_differences(recorded, current)
    if differences:
        raise ArchiveError(
            f"run {run_id} started from other models than these, so a re-run would not reproduce it: "
            f"{'; '.join(differences)}"
        )
    return notes


def _manifest_config(run_dir: Path) -> tuple[dict[str, Any], RunConfig]:
    manifest = read_manifest(run_dir)
    if "config" not in manifest:
        raise ArchiveError(f"{run_dir / 'manifest.json'} has no `config` section")
    try:
        return manifest, RunConfig.model_validate(manifest["config"])
    except ValueError as exc:
        raise ConfigError(f"{run_dir / 'manifest.json'}: config no longer validates: {exc}") from None


@dataclass
class Rerun:
    """A FINISHED run's manifest config under a new run name, ready for `runner.execute`; the
    caller runs it (archive sits below the runner) and `compare`s the two summaries."""

    run_id: str
    config: RunConfig
    original: dict[str, Any]
    notes: list[str]

    def compare(self, summary: dict[str, Any]) -> Reproduction:
        return Reproduction(
            self.run_id, summary["run_id"], compare_summaries(self.original, summary), self.notes
        )


def prepare_rerun(run_dir: Path) -> Rerun:
    """Train again from the manifest (same config and seed): the config to run and what to compare."""
    original = RunDir(run_dir).read_summary()
    if original.get("status") != "FINISHED":
        raise ArchiveError(
            f"run {run_dir.name} is {original.get('status', 'unknown')}; reproduce a FINISHED run"
        )
    manifest, config = _manifest_config(run_dir)
    notes = check_start(manifest, config, run_dir.name) + environment_notes(manifest, config)
    config.tracking.run_name = f"{run_dir.name}-repro-{secrets.token_hex(2)}"
    # A reproduction of a grid cell stands on its own: the grid's run holds one child per cell.
    config.tracking.parent_run_id = None
    return Rerun(run_dir.name, config, original, notes)


def final_checkpoint(run_dir: Path, config: RunConfig) -> Path:
    """The run's last checkpoint: a model folder (`config.json`) or a LoRA run's adapters."""
    path = RunDir(run_dir).checkpoint(config.optim.max_steps)
    if not any((path / name).exists() for name in MODEL_FILES):
        raise ArchiveError(f"{path} is missing; restore it with `distill archive pull {run_dir.name}` first")
    return path


def reproduce_eval(run_dir: Path, say: Say = print, show_progress: bool = True) -> Reproduction:
    """Evaluate the run's final checkpoint as the run did (each domain of a mixed run on its own
    items) and compare with its recorded final eval, in all and domain by domain."""
    import torch

    original = RunDir(run_dir).read_summary()
    if "student_after" not in original:
        raise ArchiveError(f"run {run_dir.name} has no final eval in summary.json")
    manifest, config = _manifest_config(run_dir)
    notes = environment_notes(manifest, config)
    if config.threads:
        torch.set_num_threads(config.threads)
    checkpoint = final_checkpoint(run_dir, config)
    say(f"evaluating {checkpoint}")
    device = place("auto", "student", this_machine())  # the GPU where there is one (notes say if it differs)
    engine = HFEngine.load(str(checkpoint), config.student.precision, config.student.enable_thinking, device)
    domain = build_domain(config.domain)
    parts: dict[str, dict[str, Any]] = {}
    try:
        scope = eval_parts(config, domain)

        def done(part: str, result: EvalResult) -> None:
            if len(scope) > 1:
                parts[part] = {"student_after": result.metrics}

        result = evaluate_parts(config, scope, engine, "eval: final checkpoint", show_progress, done)
    finally:
        domain.close()
    reproduced = {"student_after": result.metrics, "parts": parts}
    comparisons = compare_summaries(original, reproduced, sections=("student_after",))
    return Reproduction(run_dir.name, None, comparisons, notes)
