"""One eval result over the parts of a mixed run (evals/mixed.py)."""

from __future__ import annotations

import pytest

from distill.evals.mixed import combined
from distill.evals.single_turn import EvalResult


def test_counts_add_up_and_rates_are_item_weighted() -> None:
    rlve = EvalResult(
        metrics={"accuracy": 0.5, "items": 100.0, "solved": 50.0, "overlong_skipped": 2.0}, rows=[]
    )
    dapo = EvalResult(metrics={"accuracy": 0.2, "items": 50.0, "solved": 10.0}, rows=[{"id": "d"}])
    out = combined({"rlve": rlve, "dapo": dapo})
    assert out.metrics["items"] == 150 and out.metrics["solved"] == 60
    assert out.metrics["accuracy"] == pytest.approx(60 / 150)  # the share of all items solved
    assert out.metrics["overlong_skipped"] == 2  # dapo skipped none
    assert list(out.metrics)[0] == "accuracy"  # the parts' order of figures
    assert out.rows == [{"id": "d", "domain": "dapo"}]
