"""Single-turn eval: k samples per item from an engine, graded by the domain's verifier."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.evals.metrics import summarize
from distill.evals.overlong import fit_context
from distill.progress import progress_bar

if TYPE_CHECKING:
    from distill.config import EvalConfig
    from distill.domains.base import Domain, Item
    from distill.engines.base import Engine


@dataclass
class EvalResult:
    metrics: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def named(self, benchmark: str) -> dict[str, float]:
        """The metrics under DESIGN.md's names: `eval/<benchmark>/<metric>`."""
        return {f"eval/{benchmark}/{k}": v for k, v in self.metrics.items()}

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as fh:
            fh.write(json.dumps({"metrics": self.metrics}) + "\n")
            for row in self.rows:
                fh.write(json.dumps(row) + "\n")


def evaluate(
    engine: Engine,
    domain: Domain,
    items: list[Item],
    config: EvalConfig,
    label: str = "eval",
    show_progress: bool = True,
) -> EvalResult:
    k = config.k
    prompts = [engine.prompt_ids(item.prompt) for item in items]
    # Prompts that leave no room to answer: named and stopped, or left out (eval.overlong).
    fit = fit_context(items, [len(p) for p in prompts], engine.context, config.overlong, label)
    items, prompts = [items[i] for i in fit.kept], [prompts[i] for i in fit.kept]
    rows_in = [p for p in prompts for _ in range(k)]
    with progress_bar(label, total=len(rows_in), enabled=show_progress) as advance:
        completions = engine.generate(
            rows_in, config.sampling(), batch_size=config.batch_size, progress=advance
        )
    correct: list[list[bool]] = []
    lengths: list[list[int]] = []
    truncated: list[list[bool]] = []
    rows: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        samples = completions[i * k : (i + 1) * k]
        scores = domain.score_batch([item] * k, [c.text for c in samples])
        correct.append([s.correct for s in scores])
        lengths.append([len(c.ids) for c in samples])
        truncated.append([c.truncated for c in samples])
        rows.append(
            {
                "id": item.id,
                "answer": item.answer,
                "correct": sum(s.correct for s in scores),
                "k": k,
                "responses": [c.text for c in samples[:2]],
                "truncated": sum(c.truncated for c in samples),
                "tokens_mean": sum(len(c.ids) for c in samples) / k,
            }
        )
    metrics = summarize(correct, lengths, truncated, k)
    if fit.overlong:
        metrics["overlong_skipped"] = float(len(fit.overlong))
    return EvalResult(metrics=metrics, rows=rows + fit.rows(engine.context))
