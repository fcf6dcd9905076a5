"""The math grader: a final \\boxed{} is required; math-verify equivalence; worker processes."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from distill.domains.dapo.grader import Grade, MathGrader, extract_boxed, final_answer


@pytest.fixture(scope="module")
def grader() -> Iterator[MathGrader]:
    g = MathGrader(workers=2, timeout_s=5)
    yield g
    g.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("nested \\boxed{a^{2}+\\sqrt{b}}", "a^{2}+\\sqrt{b}"),
        ("spaced \\boxed {7}", "7"),
        # The last box is the answer: unclosed (cut at the budget), it is no answer at all.
        ("closed earlier \\boxed{3} but the last is open \\boxed{4", None),
        ("\\boxed{3} then a malformed \\boxed 4", None),
        ("the answer is 42", None),
        ("\\boxed", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>maybe \\boxed{3}</think> so \\boxed{4}", "4"),
        # The thinking's boxes are drafts: after </think> only the final text counts.
        ("<think>\\boxed{3}</think> the answer is 3", None),
        # Cut inside the thinking: no final answer, whatever it boxed while thinking.
        ("<think>first \\boxed{3}, let me check", None),
        # A template that opens the thinking in the prompt: the response closes it.
        ("so \\boxed{2}</think>\n\\boxed{5}", "5"),
        ("no thinking at all \\boxed{7}", "7"),
    ],
)
def test_final_answer_follows_the_thinking(text: str, expected: str | None) -> None:
    assert final_answer(text) == expected


def test_a_replaced_answer_cut_short_grades_as_no_answer(grader: MathGrader) -> None:
    # The response boxed 42, went on to replace it and was cut inside the new box: not 42.
    assert grader.grade("42", "\\boxed{42}. recheck \\boxed{4") == Grade(correct=False, formatted=False)
    assert grader.grade("42", "<think>\\boxed{42}, but") == Grade(correct=False, formatted=False)
    assert grader.grade("42", "<think>hmm</think>\\boxed{42}") == Grade(correct=True, formatted=True)


def test_equivalent_forms_grade_correct(grader: MathGrader) -> None:
    cases = [
        ("\\frac{1}{576}", "so the probability is \\boxed{1/576}"),
        ("1/576", "\\boxed{\\frac{1}{576}}"),
        # HMMT25 problem 10: the two roots, in the other order.
        (
            "\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}",
            "\\boxed{\\frac{-1-\\sqrt{17}}{2}, \\frac{-1+\\sqrt{17}}{2}}",
        ),
        ("9\\sqrt{15}", "\\boxed{9 \\sqrt{15}}"),
        ("70", "\\boxed{70}"),
        ("0.5", "\\boxed{\\frac{1}{2}}"),
    ]
    grades = grader.grade_batch([ref for ref, _ in cases], [resp for _, resp in cases])
    assert grades == [Grade(correct=True, formatted=True)] * len(cases)


def test_unboxed_and_wrong_answers_do_not_grade(grader: MathGrader) -> None:
    refs = ["70", "70", "\\frac{1}{576}", "70", "70"]
    responses = [
        "The answer is 70.",  # unboxed: not an answer
        "70",
        "\\boxed{1/575}",
        "\\boxed{71}",
        "\\boxed{}",
    ]
    grades = grader.grade_batch(refs, responses)
    assert [g.correct for g in grades] == [False] * 5
    assert [g.formatted for g in grades] == [False, False, True, True, False]


def test_last_boxed_counts(grader: MathGrader) -> None:
    assert grader.grade("5", "first \\boxed{5}, no wait: \\boxed{6}") == Grade(correct=False, formatted=True)
    assert grader.grade("6", "first \\boxed{5}, no wait: \\boxed{6}") == Grade(correct=True, formatted=True)


def test_grading_runs_in_worker_processes(grader: MathGrader) -> None:
    grader.grade("1", "\\boxed{1}")
    pids = {p.pid for p in grader._pool._pool}
    assert pids and os.getpid() not in pids and len(pids) == 2
    grader.close()
    assert grader._pool is None
    # A closed grader starts a fresh pool on the next use.
    assert grader.grade("2", "\\boxed{2}").correct


def test_length_mismatch_and_bad_settings_are_errors() -> None:
    with pytest.raises(ValueError, match="2 references but 1 responses"):
        MathGrader().grade_batch(["1", "2"], ["\\boxed{1}"])
    with pytest.raises(ValueError, match="workers"):
        MathGrader(workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        MathGrader(timeout_s=0)


def test_a_runaway_expression_times_out_as_wrong() -> None:
    # 10^(10^(10^10)) cannot be evaluated: math-verify's per-item alarm (in the worker) stops it,
    # the item grades as wrong, and the items after it still grade.
    import time

    g = MathGrader(workers=1, timeout_s=2)
    try:
        start = time.monotonic()
        grades = g.grade_batch(
            ["3", "2"], ["\\boxed{10^{10^{10^{10}}} - 10^{10^{10^{10}}} + 3}", "\\boxed{2}"]
        )
        assert [gr.correct for gr in grades] == [False, True]
        assert time.monotonic() - start < 3 * 2 + 10 + 30
    finally:
        g.close()


def _slow_worker_start() -> None:
    # A worker whose start (spawn + imports) outlasts an item's deadline, as on a loaded machine.
    import time

    import math_verify  # noqa: F401

    time.sleep(14)


class _SlowStartGrader(MathGrader):
    initializer = staticmethod(_slow_worker_start)


@pytest.mark.integration
def test_a_slow_worker_start_grades_no_item_wrong() -> None:
    # timeout_s=1: an item's deadline is 3 * 1 + 10 = 13 s, shorter than the worker's start;
    # the start must not count against the first item.
    g = _SlowStartGrader(workers=1, timeout_s=1)
    try:
        assert [gr.correct for gr in g.grade_batch(["3", "4"], ["\\boxed{3}", "\\boxed{4}"])] == [True, True]
    finally:
        g.close()
