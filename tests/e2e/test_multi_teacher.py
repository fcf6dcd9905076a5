"""`distill run --domain rlve,dapo` with a teacher per domain, one of another family, each scoring
in its own worker process (rollout.async_teacher): the run's record holds each domain's figures
and each teacher where it ran."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from e2e.test_run import _distill, _only_run

pytestmark = pytest.mark.integration


def _two_domains(tiny_zoo: Any, teachers: list[str], *overrides: str) -> list[str]:
    """`distill run` over rlve and dapo on the tiny zoo, a few prompts and tokens a step."""
    return [
        "run",
        "--domain",
        "rlve,dapo",
        "--method",
        "opd",
        "--student",
        str(tiny_zoo.student),
        *teachers,
        "domain.train_size=16",
        "domain.parts.rlve.train_size=8",
        "domain.parts.dapo.train_size=8",
        "domain.parts.rlve.eval_size=4",
        "domain.parts.dapo.eval_size=4",
        "checkpoint.every_steps=0",
        "rollout.prompts_per_step=2",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=12",
        "method.top_k=4",
        "eval.max_new_tokens=8",
        "threads=1",
        *overrides,
    ]


def test_two_domains_two_teachers_one_of_another_family(tmp_path: Path, tiny_zoo: Any) -> None:
    ws = tmp_path / "ws"
    teachers = ["--teacher", f"rlve={tiny_zoo.teacher}", "--teacher", f"dapo={tiny_zoo.teacher_llama}"]
    args = _two_domains(tiny_zoo, teachers, "optim.max_steps=2", "rollout.async_teacher=true")
    proc = _distill(args, ws, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = _only_run(ws)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "FINISHED" and summary["domain"] == "rlve+dapo"
    for part in ("rlve", "dapo"):
        # Each domain evaluated on its own items, the student before and after, and its teacher
        # (the teacher's eval generated in its worker process).
        assert set(summary["parts"][part]) >= {"student_before", "student_after", "teacher_score"}, part
        assert summary["parts"][part]["teacher_score"]["items"] == 4
    models = json.loads((run_dir / "manifest.json").read_text())["models"]
    assert models["teacher@rlve"]["path"] == str(tiny_zoo.teacher)
    assert models["teacher@dapo"]["class"] == "LlamaForCausalLM"
    for role in ("teacher@rlve", "teacher@dapo"):
        assert models[role]["device"] == models[role]["worker_device"] == "cpu", role
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # The seed's first step draws prompts of both domains (a step of two prompts may hold one).
    assert {"perf/teacher_time_s/rlve", "perf/teacher_time_s/dapo"} <= set(steps[0])
    for r in steps:
        assert math.isfinite(r["train/loss"])
        scored = [p for p in ("rlve", "dapo") if f"perf/teacher_time_s/{p}" in r]
        for part in scored:  # each domain's figures whenever the step held its rows
            assert math.isfinite(r[f"kl/{part}/reverse_kl_mean"]), part
        assert ("kl/dapo/aligned_share" in r) == ("dapo" in scored)
        assert "kl/rlve/aligned_share" not in r  # rlve's teacher shares the student's tokenizer
        # Two teachers side by side: the step's teacher time is the slower one's.
        assert r["perf/teacher_time_s"] >= max(r[f"perf/teacher_time_s/{p}"] for p in scored) - 1e-6
        assert 0.0 <= r["perf/overlap_s"] <= r["perf/teacher_time_s"]


def test_alternate_steps_each_train_one_domain_at_its_own_lr(tmp_path: Path, tiny_zoo: Any) -> None:
    ws = tmp_path / "ws"
    args = _two_domains(
        tiny_zoo,
        ["--teacher", str(tiny_zoo.teacher)],
        "domain.mix.rlve=1",
        "domain.mix.dapo=2",
        "domain.alternate=true",
        "domain.lr.dapo=3e-4",
        "optim.lr=1e-4",
        "optim.scheduler=constant",
        "optim.max_steps=3",
    )
    proc = _distill(args, ws, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (_only_run(ws) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    # dapo holds 2 of 3 shares: its steps first and third, each step's prompts its domain's alone.
    trained = [[p for p in ("rlve", "dapo") if f"kl/{p}/reverse_kl_mean" in r] for r in steps]
    assert trained == [["dapo"], ["rlve"], ["dapo"]]
    assert [r["train/lr"] for r in steps] == pytest.approx([3e-4, 1e-4, 3e-4])
