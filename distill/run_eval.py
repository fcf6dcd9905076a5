"""The evals of one run: before training, every `eval.every_steps`, after; each written to the run's
`eval/`, logged under `eval/<domain>/` (the teacher's under `teacher/`), and in a run over
several domains made per domain (each by its own teacher, for the teacher's eval) and combined.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distill.domains.mixed import MixedDomain
from distill.evals import evaluator_for
from distill.evals.mixed import combined

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.domains.base import Domain, Item
    from distill.engines.base import Engine
    from distill.evals.single_turn import EvalResult
    from distill.tracking.rundir import RunDir
    from distill.tracking.steplog import StepRecord


def eval_parts(config: RunConfig, domain: Domain) -> dict[str, tuple[Domain, list[Item]]]:
    """What a run evaluates: each domain of a mixed run on `eval.items` of its own items (one
    entry for a one-domain run)."""
    n = config.eval.items
    if isinstance(domain, MixedDomain):
        return {p: (d, d.eval_items()[:n]) for p, d in domain.parts().items()}
    return {domain.name: (domain, domain.eval_items()[:n])}


def evaluate_parts(
    config: RunConfig,
    parts: dict[str, tuple[Domain, list[Item]]],
    engine: Engine | dict[str, Engine],
    label: str,
    show_progress: bool = True,
    done: Callable[[str, EvalResult], Any] | None = None,
) -> EvalResult:
    """The run's eval of `engine` (a teacher per domain: a dict): each part on its own items, then
    the one result over all of them; `done` gets each part's result as it is made."""
    results = {}
    for part, (domain, items) in parts.items():
        model = engine[part] if isinstance(engine, dict) else engine
        shown = label if len(parts) == 1 else f"{label} [{part}]"
        results[part] = evaluator_for(domain)(model, domain, items, config.eval, shown, show_progress)
        if done is not None:
            done(part, results[part])
    return results[next(iter(results))] if len(results) == 1 else combined(results)


class RunEval:
    """`run_eval(engine, label, step, prefix)`: the run's eval of `engine` at `step`."""

    def __init__(self, config: RunConfig, run: RunDir, domain: Domain, log: StepRecord) -> None:
        self.config, self.run, self.domain, self.log = config, run, domain, log
        self.parts = eval_parts(config, domain)

    def __call__(
        self,
        engine: Engine | dict[str, Engine],
        label: str,
        step: int,
        prefix: str = "",
        record: Callable[[str, dict[str, float]], Any] | None = None,
    ) -> EvalResult:
        """Evaluate `engine` (a teacher per domain: a dict) and return the run's result; `record`
        gets each domain's metrics in a run over several domains."""

        def done(part: str, result: EvalResult) -> None:
            if len(self.parts) > 1:
                result.write(self.run.eval_file(step, f"{prefix}{part}/"))
                self.log.write(step, {f"{prefix}{k}": v for k, v in result.named(part).items()})
                if record is not None:
                    record(part, result.metrics)

        result = evaluate_parts(self.config, self.parts, engine, label, done=done)
        result.write(self.run.eval_file(step, prefix))
        self.log.write(step, {f"{prefix}{k}": v for k, v in result.named(self.config.domain.name).items()})
        return result


def step0_evals_to_redo(summary: dict[str, Any], config: RunConfig) -> tuple[str, ...]:
    """The key prefixes of the step-0 evals a resume runs again: those `summary.json` does not
    record (the run was stopped during them, maybe between the parts of a mixed eval). Their
    rows already written are trimmed, so the eval run again logs each point once."""
    redo = []
    if "student_before" not in summary:
        redo.append("eval/")
    if config.eval.eval_teacher and "teacher_score" not in summary:
        redo.append("teacher/eval/")
    return tuple(redo)


def parts_recorder(summary: dict[str, Any], section: str) -> Callable[[str, dict[str, float]], None]:
    """Keeps each domain's metrics of one eval (`student_before`, ...) under `summary["parts"]`."""

    def record(part: str, metrics: dict[str, float]) -> None:
        summary.setdefault("parts", {}).setdefault(part, {})[section] = metrics

    return record
