"""Benchmark and training-data loaders: the real files of ../shared/data and small synthetic ones."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from distill.domains.dapo.data import (
    BOXED_INSTRUCTION,
    DataError,
    load_benchmark,
    load_hub,
    load_problems,
    problem_prompt,
)
from distill.domains.dapo.grader import MathGrader

# ../shared/data next to the checkout (override with DISTILL_SHARED_DATA); never copied in.
SHARED = Path(
    os.environ.get("DISTILL_SHARED_DATA", Path(__file__).resolve().parents[3].parent / "shared/data")
)
FIXTURES = Path(__file__).parent / "fixtures"

needs_shared = pytest.mark.skipif(
    not (SHARED / "aime25.json").exists(),
    reason=f"reference data not found at {SHARED} (set DISTILL_SHARED_DATA to the shared/data folder)",
)


@pytest.fixture(scope="module")
def grader() -> Iterator[MathGrader]:
    g = MathGrader(workers=2, timeout_s=10)
    yield g
    g.close()


def _self_grade(grader: MathGrader, answers: list[str]) -> list[bool]:
    return [g.correct for g in grader.grade_batch(answers, [f"\\boxed{{{a}}}" for a in answers])]


@needs_shared
def test_aime25_json(grader: MathGrader) -> None:
    items = load_benchmark("aime25", SHARED / "aime25.json")
    assert len(items) == 30
    assert len({i.id for i in items}) == 30 and items[0].id == "aime25-1"
    assert all(i.prompt.endswith(BOXED_INSTRUCTION) for i in items)
    # The README's pitfall: this copy carries problem 20 as 336, not 336^\circ.
    assert items[19].answer == "336"
    assert _self_grade(grader, [i.answer for i in items]) == [True] * 30


@needs_shared
def test_hmmt25_matharena_folder(grader: MathGrader) -> None:
    items = load_benchmark("hmmt25", SHARED / "hmmt_feb_2025")
    assert len(items) == 30
    by_id = {i.id: i for i in items}
    assert by_id["hmmt25-1"].prompt.startswith("Compute the sum of the positive divisors")
    assert by_id["hmmt25-3"].answer == "\\frac{1}{576}"
    # Fractions, radicals, a pair of roots, a factorial: all grade as correct against themselves.
    assert _self_grade(grader, [i.answer for i in items]) == [True] * 30
    ten = by_id["hmmt25-10"].answer
    swapped = ", ".join(reversed(ten.split(", ")))
    assert grader.grade(ten, f"\\boxed{{{swapped}}}").correct
    assert not grader.grade(ten, "\\boxed{\\frac{-1+\\sqrt{17}}{2}}").correct


@needs_shared
def test_dapo_parquet(grader: MathGrader) -> None:
    items = load_problems(SHARED / "dapo_math_17k_first2000.parquet", "dapo")
    assert len(items) == 2000
    assert items[0].answer == "34" and items[0].id == "dapo-0"
    assert all(i.answer.lstrip("-").isdigit() for i in items)
    # A spread of the 2,000: every reference grades as correct against itself.
    sample = [i.answer for i in items[::50]]
    assert _self_grade(grader, sample) == [True] * len(sample)


def test_hub_loader_on_a_local_dataset_folder() -> None:
    # The same code path as `load_benchmark("aime25")` without --data (datasets.load_dataset),
    # fed a three-row folder in MathArena's hub layout (problem_idx, problem, answer).
    items = load_hub(str(FIXTURES / "matharena_hub"), "train", "aime25")
    assert [i.id for i in items] == ["aime25-1", "aime25-2", "aime25-3"]
    assert items[1].answer == "\\frac{1}{576}"
    assert all(i.prompt.endswith(BOXED_INSTRUCTION) for i in items)


def test_offline_hub_id_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="cannot load dataset 'no-such-org/no-such-set'.*local file"):
        load_problems("no-such-org/no-such-set", "x")


def test_layouts_json_jsonl_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    plain = [{"problem": "What is $1+1$?", "answer": 2}, {"problem": "Half of 4?", "answer": "2", "id": "h"}]
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    rlve = [{"user_prompt": "Sum 2 and 2. Put it in \\boxed{}.", "ground_truth": "4"}]
    (tmp_path / "rlve.jsonl").write_text("\n".join(json.dumps(r) for r in rlve) + "\n\n")
    verl = [
        {
            "prompt": [
                {
                    "role": "user",
                    "content": "Solve the following math problem step by step. "
                    "The last line of your response should be of the form Answer: $Answer (without "
                    "quotes) where $Answer is the answer to the problem.\n\nWhat is $3^2$?\n\n"
                    'Remember to put your answer on its own line after "Answer:"',
                }
            ],
            "reward_model": {"ground_truth": "9", "style": "rule"},
            "extra_info": {"index": 7},
        }
    ]
    pq.write_table(pa.Table.from_pylist(verl), tmp_path / "verl.parquet")

    a = load_problems(tmp_path / "plain.json", "p")
    assert [(i.id, i.answer) for i in a] == [("p-1", "2"), ("p-h", "2")]
    b = load_problems(tmp_path / "rlve.jsonl", "r")
    # A prompt that already asks for \boxed{} keeps its own wording.
    assert b[0].prompt == "Sum 2 and 2. Put it in \\boxed{}." and b[0].answer == "4"
    c = load_problems(tmp_path / "verl.parquet", "v")
    # DAPO's "Answer:" wrapper gives way to the boxed instruction every source is graded by.
    assert c[0].id == "v-7" and c[0].prompt == "What is $3^2$?" + BOXED_INSTRUCTION
    # A folder of data files loads them all, in name order.
    assert len(load_problems(tmp_path, "all")) == 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[{"problem": "x"}]', r"rows\.json: row 0: field 'answer' is missing"),
        ('[{"question": "x", "answer": "1"}]', r"rows\.json: row 0: unknown row layout"),
        ('[{"problem": "ok", "answer": "1"}, 3]', r"rows\.json: row 1: expected an object"),
        ('{"problem": "x"}', r"rows\.json: expected a JSON list"),
        ("[{", r"rows\.json: not valid JSON"),
        (
            '[{"prompt": "flat", "reward_model": {"ground_truth": "1"}}]',
            r"row 0: field 'prompt' must be a list",
        ),
        ('[{"prompt": [{"content": "q"}], "reward_model": {}}]', r"row 0: field 'reward_model.ground_truth'"),
    ],
)
def test_malformed_rows_name_file_and_row(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "rows.json"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        load_problems(path, "x")


def test_malformed_jsonl_line_and_missing_paths(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{oops\n')
    with pytest.raises(DataError, match=r"rows\.jsonl: line 2 is not valid JSON"):
        load_problems(path, "x")
    with pytest.raises(DataError, match=r"nope\.parquet: no such file or folder"):
        load_problems(tmp_path / "nope.parquet", "x")
    with pytest.raises(DataError, match="unknown benchmark 'aime99'; known: aime25, hmmt25, aime24"):
        load_benchmark("aime99", tmp_path)


def test_matharena_folder_missing_problem(tmp_path: Path) -> None:
    (tmp_path / "problems").mkdir()
    (tmp_path / "answers.csv").write_text('id,answer\n1,5\n2,"\\frac{1}{2}"\n')
    (tmp_path / "problems" / "1.tex").write_text("Compute $2+3$.")
    with pytest.raises(DataError, match=r"answers\.csv: line 3: problem file .*2\.tex is missing"):
        load_benchmark("hmmt25", tmp_path)
    (tmp_path / "problems" / "2.tex").write_text("Half of one?")
    items = load_benchmark("hmmt25", tmp_path)
    assert [(i.id, i.answer) for i in items] == [("hmmt25-1", "5"), ("hmmt25-2", "\\frac{1}{2}")]


def test_problem_prompt_and_protocols() -> None:
    from distill.evals.standalone import PROTOCOLS

    assert problem_prompt("  What is 2?  ") == "What is 2?" + BOXED_INSTRUCTION
    ref, opsd = PROTOCOLS["reference"], PROTOCOLS["opsd"]
    assert (ref.k, ref.temperature, ref.top_p, ref.max_new_tokens, ref.enable_thinking) == (
        16,
        0.7,
        0.95,
        31744,
        True,
    )
    assert (opsd.k, opsd.temperature, opsd.max_new_tokens, opsd.enable_thinking) == (12, 1.0, 38912, False)
