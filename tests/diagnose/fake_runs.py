"""Run directories written by hand, each shaped like one pathology (or like a healthy run).

`write_run` writes the files a real run leaves (config.yaml, summary.json, manifest.json,
metrics.jsonl, eval/, samples/) under a workspace, so runs resolve by id like real ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from distill.config import RunConfig, set_dotted


def series_rows(steps: int, **curves: Callable[[int], float]) -> list[dict[str, Any]]:
    """One metrics line per step 1..steps, each key from its function of the step."""
    return [
        {"step": s, **{k.replace("__", "/"): f(s) for k, f in curves.items()}} for s in range(1, steps + 1)
    ]


def eval_rows(bench: str, step: int, metrics: dict[str, float]) -> dict[str, Any]:
    return {"step": step, **{f"eval/{bench}/{k}": v for k, v in metrics.items()}}


def healthy_metrics(steps: int = 50) -> list[dict[str, Any]]:
    """An OPD run that learns: loss and KL falling steadily, nothing truncated, accuracy rising."""
    rows = series_rows(
        steps,
        train__loss=lambda s: 2.0 - 0.02 * s,
        train__grad_norm=lambda s: 1.0 + 0.1 * math.sin(s),
        train__lr=lambda s: 1e-5,
        kl__reverse_kl_mean=lambda s: 0.5 - 0.005 * s,
        kl__advantage_mean=lambda s: -0.5 + 0.005 * s,
        student__truncation_rate=lambda s: 0.02,
        student__completion_tokens_mean=lambda s: 40.0,
        student__completion_tokens_max=lambda s: 60.0,
        student__accuracy=lambda s: 0.2 + 0.006 * s,
        student__reward_mean=lambda s: 0.2 + 0.006 * s,
    )
    first = {
        "avg@4": 0.2,
        "pass@4": 0.4,
        "pass@1": 0.2,
        "solved": 8.0,
        "truncation_rate": 0.02,
        "response_tokens_p90": 50.0,
    }
    last = {
        "avg@4": 0.4,
        "pass@4": 0.6,
        "pass@1": 0.4,
        "solved": 12.0,
        "truncation_rate": 0.01,
        "response_tokens_p90": 48.0,
    }
    return [eval_rows("rlve", 0, first), *rows, eval_rows("rlve", steps, last)]


HEALTHY_CONFIG = {
    "student.precision": "fp32",
    "optim.lr": 1e-5,
    "optim.max_steps": 50,
    "eval.k": 4,
    "student.enable_thinking": False,
    "teacher.enable_thinking": False,
}


def write_run(
    workspace: Path,
    name: str,
    *,
    config: dict[str, Any] | None = None,
    method: dict[str, Any] | None = None,
    metrics: list[dict[str, Any]] | None = None,
    summary: dict[str, Any] | None = None,
    manifest: dict[str, Any] | None = None,
    evals: dict[int, tuple[dict[str, float], list[dict[str, Any]]]] | None = None,
    samples: dict[int, list[dict[str, Any]]] | None = None,
    preflight: dict[str, Any] | None = None,
) -> Path:
    run_dir = workspace / "runs" / name
    run_dir.mkdir(parents=True)
    data = RunConfig().model_dump(mode="json")
    if method is not None:
        data["method"] = method  # e.g. rose, which this version's RunConfig does not know yet
    for key, value in (config or {}).items():
        set_dotted(data, key.split("."), value)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    base = {
        "run_id": name,
        "status": "FINISHED",
        "domain": data["domain"]["name"],
        "method": data["method"]["name"],
        "student": data["student"]["name"],
        "teacher": data["teacher"]["name"],
        "started": "2026-01-01T00:00:00+00:00",
    }
    (run_dir / "summary.json").write_text(json.dumps({**base, **(summary or {})}))
    if manifest is not None:
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
    if preflight is not None:
        (run_dir / "preflight.json").write_text(json.dumps(preflight))
    with (run_dir / "metrics.jsonl").open("w") as fh:
        for row in metrics or []:
            clean = {
                k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in row.items()
            }
            fh.write(json.dumps(clean) + "\n")
    for step, (m, rows) in (evals or {}).items():
        path = run_dir / "eval" / f"step-{step}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("\n".join(json.dumps(r) for r in [{"metrics": m}, *rows]) + "\n")
    for step, rows in (samples or {}).items():
        path = run_dir / "samples" / f"step-{step}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return run_dir
