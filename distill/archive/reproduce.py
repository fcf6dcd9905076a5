"""`distill reproduce <run>`: re-create a run from its manifest and say whether its numbers match.

Full mode (`prepare_rerun`, run by the caller through `runner.execute`) re-runs training with the manifest's resolved config (same seed, same data, same
models) as a new run `<run>-repro-<hex>` and compares every eval figure of the two summaries.
`--eval-only` loads the run's final checkpoint (e.g. after `distill archive pull`) and repeats the
final eval only. Both compare exactly: greedy eval on CPU is deterministic, so any difference is a
real one (other package versions, thread counts, or drifted files), and the notes name the
differences in environment the manifest shows.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.archive.dvcrepo import ArchiveError
from distill.archive.manifest import package_versions, read_manifest
from distill.tracking.rundir import RunDir

if TYPE_CHECKING:
    from distill.config import RunConfig

Say = Any  # a callable(str) that prints for the user
SECTIONS = ("student_before", "teacher_score", "student_after")


@dataclass(frozen=True)
class Comparison:
    section: str
    metric: str
    original: float
    reproduced: float

    @property
    def match(self) -> bool:
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


def compare_summaries(original: dict[str, Any], reproduced: dict[str, Any]) -> list[Comparison]:
    out = []
    for section in SECTIONS:
        before, after = original.get(section), reproduced.get(section)
        if not isinstance(before, dict) or not isinstance(after, dict):
            continue
        for metric in sorted(before.keys() & after.keys()):
            a, b = before[metric], after[metric]
            if isinstance(a, int | float) and isinstance(b, int | float):
                out.append(Comparison(section, metric, float(a), float(b)))
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
    return notes


def _manifest_config(run_dir: Path) -> tuple[dict[str, Any], RunConfig]:
    from distill.config import ConfigError, RunConfig

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
    notes = environment_notes(manifest, config)
    config.tracking.run_name = f"{run_dir.name}-repro-{secrets.token_hex(2)}"
    return Rerun(run_dir.name, config, original, notes)


def final_checkpoint(run_dir: Path, config: RunConfig) -> Path:
    path = RunDir(run_dir).checkpoint(config.optim.max_steps)
    if not (path / "config.json").exists():
        raise ArchiveError(f"{path} is missing; restore it with `distill archive pull {run_dir.name}` first")
    return path


def reproduce_eval(run_dir: Path, say: Say = print, show_progress: bool = True) -> Reproduction:
    """Evaluate the run's final checkpoint as the run did and compare with its recorded final eval."""
    import torch

    from distill.domains import build_domain
    from distill.engines.hf import HFEngine
    from distill.evals import evaluator_for

    original = RunDir(run_dir).read_summary()
    if "student_after" not in original:
        raise ArchiveError(f"run {run_dir.name} has no final eval in summary.json")
    manifest, config = _manifest_config(run_dir)
    notes = environment_notes(manifest, config)
    if config.threads:
        torch.set_num_threads(config.threads)
    checkpoint = final_checkpoint(run_dir, config)
    say(f"evaluating {checkpoint}")
    engine = HFEngine.load(str(checkpoint), config.student.precision, config.student.enable_thinking)
    domain = build_domain(config.domain)
    try:
        items = domain.eval_items()[: config.eval.items]
        evaluate = evaluator_for(domain)
        result = evaluate(engine, domain, items, config.eval, "eval: final checkpoint", show_progress)
    finally:
        domain.close()
    reproduced = {"student_after": result.metrics}
    return Reproduction(run_dir.name, None, compare_summaries(original, reproduced), notes)
