"""`eval.overlong`: items whose prompt fills the model's context are named (fail) or left out and
reported (skip), in the metrics, the eval record and `distill eval`'s summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from distill.config import EvalConfig
from distill.engines.context import ContextError
from distill.engines.hf import HFEngine
from distill.evals.single_turn import evaluate

ITEMS = 6


@pytest.fixture(scope="module")
def setup(tiny_zoo: Any) -> tuple[HFEngine, Any, list[Any], int]:
    """The tiny student with its context cut just below the longest of the first items' prompts."""
    from distill.domains import build_domain

    domain = build_domain(tiny_zoo.domain)
    items = domain.eval_items()[:ITEMS]
    engine = HFEngine.load(str(tiny_zoo.student))
    lengths = [len(engine.prompt_ids(item.prompt)) for item in items]
    assert min(lengths) < max(lengths), lengths  # else nothing tells skipped from kept
    engine.model.config.max_position_embeddings = max(lengths)
    yield engine, domain, items, max(lengths)
    domain.close()


def test_fail_names_the_items(setup: Any) -> None:
    engine, domain, items, context = setup
    longest = [item.id for item in items if len(engine.prompt_ids(item.prompt)) >= context]
    with pytest.raises(ContextError) as err:
        evaluate(
            engine, domain, items, EvalConfig(items=ITEMS, max_new_tokens=2), "eval", show_progress=False
        )
    message = str(err.value)
    assert f"{len(longest)} of {ITEMS} prompts fill the model's {context} positions" in message
    assert all(f"{item_id} ({context} tokens)" in message for item_id in longest[:5])
    assert "eval.overlong=skip" in message and "\n" not in message


def test_skip_leaves_them_out_and_reports_them(setup: Any) -> None:
    engine, domain, items, context = setup
    cfg = EvalConfig(items=ITEMS, max_new_tokens=2, overlong="skip")
    result = evaluate(engine, domain, items, cfg, "eval", show_progress=False)
    over = [item.id for item in items if len(engine.prompt_ids(item.prompt)) >= context]
    assert result.metrics["overlong_skipped"] == len(over) > 0
    skipped = [row for row in result.rows if row.get("skipped") == "overlong"]
    assert [row["id"] for row in skipped] == over and skipped[0]["context"] == context
    graded = [row for row in result.rows if "skipped" not in row]
    assert len(graded) == ITEMS - len(over) and not {row["id"] for row in graded} & set(over)


def test_every_prompt_too_long_is_an_error_even_with_skip(setup: Any) -> None:
    engine, domain, items, context = setup
    cfg = EvalConfig(items=ITEMS, max_new_tokens=2, overlong="skip")
    engine.model.config.max_position_embeddings = 8
    try:
        with pytest.raises(ContextError, match="nothing is left to evaluate"):
            evaluate(engine, domain, items, cfg, "eval", show_progress=False)
    finally:
        engine.model.config.max_position_embeddings = context


def test_distill_eval_skips_and_records(tiny_zoo: Any, setup: Any, tmp_path: Path, capsys: Any) -> None:
    """`distill eval` (its command function) on a model folder whose config declares the short
    context: skip reports the items on stderr, in the summary table and in the written record."""
    from distill.cli.evaluate import eval_command
    from distill.evals.standalone import EvalRequest

    _, _, _, context = setup
    folder = tmp_path / "short-context"
    shutil.copytree(tiny_zoo.student, folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = context
    (folder / "config.json").write_text(json.dumps(config))
    request = EvalRequest(model=str(folder), items=ITEMS, max_new_tokens=2)
    with pytest.raises(ContextError, match="eval.overlong=skip"):
        eval_command(request)
    outcome = eval_command(EvalRequest(model=str(folder), items=ITEMS, max_new_tokens=2, overlong="skip"))
    captured = capsys.readouterr()
    skipped = int(outcome.result.metrics["overlong_skipped"])
    assert skipped > 0 and f"skipped {skipped} of {ITEMS} items" in captured.err
    assert "overlong_skipped" in captured.out
    record = [json.loads(line) for line in outcome.out.read_text().splitlines()]
    assert record[0]["metrics"]["overlong_skipped"] == skipped
    assert sum(row.get("skipped") == "overlong" for row in record[1:]) == skipped
