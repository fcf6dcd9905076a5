"""`distill compare` of a run over several domains: a row per domain beside one-domain runs."""

from __future__ import annotations

from pathlib import Path

from distill.diagnose.compare import build_table
from distill.diagnose.records import load_run

from .fake_runs import write_run


def _scores(before: float, after: float) -> dict[str, dict[str, float]]:
    return {
        "student_before": {"accuracy": before},
        "student_after": {"accuracy": after, "solved": after * 200},
    }


def test_a_mixed_run_gives_a_row_per_domain(tmp_path: Path) -> None:
    alone = write_run(tmp_path, "alone", summary={"student_after": {"accuracy": 0.6, "solved": 120.0}})
    mixed = write_run(
        tmp_path,
        "mixed",
        config={
            "domain.name": "rlve+dapo",
            "teachers": {"rlve": {"name": "/m/t-rlve"}, "dapo": {"name": "/m/t-dapo"}},
        },
        summary={
            "domain": "rlve+dapo",
            "student_after": {"accuracy": 0.5, "solved": 200.0},
            "parts": {"rlve": _scores(0.4, 0.58), "dapo": _scores(0.2, 0.42)},
        },
    )
    table = build_table([load_run(alone), load_run(mixed)])
    rows = {r.run_id: r for r in table.rows}
    assert list(rows) == ["alone", "mixed", "mixed[rlve]", "mixed[dapo]"]
    assert rows["mixed[rlve]"].domain == "rlve" and rows["mixed[rlve]"].metrics["accuracy"] == 0.58
    assert rows["mixed[dapo]"].teacher == "t-dapo"
    assert rows["mixed"].teacher == "rlve=t-rlve, dapo=t-dapo"
    assert table.delta(rows["mixed[rlve]"], "accuracy") == 0.58 - 0.6
