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


class RunEval:
    """`run_eval(engine, label, step, prefix)`: the run's eval of `engine` at `step`."""

    def __init__(self, config: RunConfig, run: RunDir, domain: Domain, log: StepRecord) -> None:
        self.config, self.run, self.domain, self.log = config, run, domain, log
        self.evaluate = evaluator_for(domain)
        n = config.eval.items
        # Each domain of a mixed run is evaluated on `eval.items` of its own items.
        self.parts: dict[str, tuple[Domain, list[Item]]] = (
            {p: (d, d.eval_items()[:n]) for p, d in domain.parts().items()}
            if isinstance(domain, MixedDomain)
            else {domain.name: (domain, domain.eval_items()[:n])}
        )

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
        results = {}
        for part, (domain, items) in self.parts.items():
            model = engine[part] if isinstance(engine, dict) else engine
            shown = label if len(self.parts) == 1 else f"{label} [{part}]"
            result = self.evaluate(model, domain, items, self.config.eval, shown)
            if len(self.parts) > 1:
                result.write(self.run.eval_file(step, f"{prefix}{part}/"))
                self.log.write(step, {f"{prefix}{k}": v for k, v in result.named(part).items()})
                if record is not None:
                    record(part, result.metrics)
            results[part] = result
        result = results[next(iter(results))] if len(results) == 1 else combined(results)
        result.write(self.run.eval_file(step, prefix))
        self.log.write(step, {f"{prefix}{k}": v for k, v in result.named(self.config.domain.name).items()})
        return result


def parts_recorder(summary: dict[str, Any], section: str) -> Callable[[str, dict[str, float]], None]:
    """Keeps each domain's metrics of one eval (`student_before`, ...) under `summary["parts"]`."""

    def record(part: str, metrics: dict[str, float]) -> None:
        summary.setdefault("parts", {}).setdefault(part, {})[section] = metrics

    return record
