"""What `distill reproduce` compares: every recorded figure, domain by domain; one the
reproduction lacks is a mismatch; a LoRA run's final checkpoint holds adapters only."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from distill.archive.dvcrepo import ArchiveError
from distill.archive.reproduce import compare_summaries, final_checkpoint


def test_a_figure_the_reproduction_lacks_is_a_mismatch() -> None:
    original = {
        "student_after": {"accuracy": 0.5, "solved": 2.0, "episodes_per_min": 3.0},
        "parts": {
            "rlve": {"student_after": {"accuracy": 0.25}},
            "dapo": {"student_after": {"accuracy": 0.75}},
        },
    }
    same = compare_summaries(original, original, sections=("student_after",))
    assert all(c.match for c in same)
    assert {(c.section, c.metric) for c in same} == {
        ("student_after", "accuracy"),
        ("student_after", "solved"),
        ("student_after [rlve]", "accuracy"),
        ("student_after [dapo]", "accuracy"),
    }  # wall-clock figures are not compared
    lost = {"student_after": {"accuracy": 0.5}, "parts": {"rlve": {"student_after": {"accuracy": 0.25}}}}
    missing = [c for c in compare_summaries(original, lost, sections=("student_after",)) if not c.match]
    assert {(c.section, c.metric) for c in missing} == {
        ("student_after", "solved"),
        ("student_after [dapo]", "accuracy"),
    }
    assert all(c.missing and math.isnan(c.reproduced) for c in missing)
    # A whole section the reproduction did not make: each of its figures is missing.
    full = compare_summaries({"teacher_score": {"accuracy": 0.9}}, {})
    assert [(c.section, c.missing, c.match) for c in full] == [("teacher_score", True, False)]


def test_a_lora_runs_final_checkpoint_is_its_adapters(tmp_path: Path) -> None:
    from distill.config import resolve_config

    config = resolve_config("rlve", "opd", None, ["optim.max_steps=3"])
    run_dir = tmp_path / "r1"
    step = run_dir / "checkpoints" / "step-3"
    with pytest.raises(ArchiveError, match="distill archive pull r1"):
        final_checkpoint(run_dir, config)
    step.mkdir(parents=True)
    (step / "adapter_config.json").write_text("{}")
    (step / "adapter_model.safetensors").write_bytes(b"")
    assert final_checkpoint(run_dir, config) == step
