"""Math answers graded with `math-verify`, in worker processes, with a timeout per item.

A response answers only through its last `\\boxed{...}`: an unboxed number is not an answer (the
reference protocol grades this way, and it keeps "the answer is 3, no wait, 5" from counting).
The last box is the answer even when it is unclosed (a response cut at its token budget): then
there is no answer, never an earlier box the response went on to replace. A response that thinks
is graded on what follows its last `</think>`; one cut inside its thinking (`<think>` opened and
never closed) has no answer, whatever it boxed while thinking: a draft is not a final answer.
The boxed content and the reference are parsed and compared by math-verify, so `\\frac{1}{576}`
and `1/576`, or a pair of roots in either order, grade as equal.

math-verify bounds its sympy work with `signal.alarm`, which only works in a process's main
thread: grading runs in a pool of worker processes, whose tasks run in their main thread. A
worker that still hangs past the outer deadline (sympy stuck in C code) is killed with its pool;
its item grades as wrong and the remaining items go to a fresh pool.
"""

from __future__ import annotations

import multiprocessing
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BOXED = "\\boxed"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Grade:
    correct: bool
    # The response ended its answer in a `\boxed{...}`.
    formatted: bool


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces balanced), or None when there is none or the
    last one is unclosed or malformed."""
    start = text.rfind(BOXED)
    if start == -1:
        return None
    i = start + len(BOXED)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def final_answer(response: str) -> str | None:
    """The boxed answer a response gives: in the text after its thinking; None when it has none
    (no box, an unclosed last box, or a response cut inside `<think>`)."""
    close = response.rfind(THINK_CLOSE)
    if close != -1:
        return extract_boxed(response[close + len(THINK_CLOSE) :])
    if THINK_OPEN in response:
        return None  # still thinking when it ended: what it boxed there was a draft
    return extract_boxed(response)


def _parse_reference(reference: str, timeout: int) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    text = reference if BOXED in reference else f"${reference}$"
    return parse(
        text,
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=timeout,
    )


def grade_in_process(reference: str, answer: str, timeout: int = 5) -> bool:
    """math-verify equivalence of a boxed answer's content with the reference (main thread only)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = _parse_reference(reference, timeout)
    if not gold:
        return False
    pred = parse(
        f"\\boxed{{{answer}}}",
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=timeout,
    )
    if not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def _worker_init() -> None:
    # Import sympy and math-verify once per worker, not on the first graded item.
    import math_verify  # noqa: F401


def _ready() -> None:
    """A job that returns once a worker has started and imported math-verify."""


def _worker_grade(reference: str, answer: str, timeout: int) -> bool:
    try:
        return grade_in_process(reference, answer, timeout)
    except Exception:
        # A parse or verify error is a wrong answer, never a crashed eval.
        return False


def _terminate(pool: Any) -> None:
    pool.terminate()
    pool.join()


class MathGrader:
    """Grades (reference, response) pairs in a lazily started pool of worker processes."""

    # What a worker runs once at start (a class attribute so a test can give a slow one).
    initializer: Any = staticmethod(_worker_init)

    def __init__(self, workers: int = 2, timeout_s: int = 5) -> None:
        if workers < 1:
            raise ValueError(f"MathGrader: workers must be >= 1, got {workers}")
        if timeout_s < 1:
            raise ValueError(f"MathGrader: timeout_s must be >= 1, got {timeout_s}")
        self.workers = workers
        self.timeout_s = timeout_s
        self._pool: Any = None
        self._finalizer: weakref.finalize | None = None

    def _ensure_pool(self) -> Any:
        if self._pool is None:
            import importlib.util

            if importlib.util.find_spec("math_verify") is None:
                raise ImportError("math answers are graded with math-verify: pip install 'distill[math]'")
            # spawn, not fork: the parent holds torch's OpenMP threads and possibly a tracker.
            ctx = multiprocessing.get_context("spawn")
            self._pool = ctx.Pool(self.workers, initializer=self.initializer)
            self._finalizer = weakref.finalize(self, _terminate, self._pool)
            # No deadline counts a worker's start (spawn + importing sympy and math-verify): on a
            # loaded machine that alone took longer than an item's deadline, so the first item
            # of every pool was graded wrong and the pool restarted, again and again.
            self._pool.apply(_ready)
        return self._pool

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._pool, self._finalizer = None, None

    def __getstate__(self) -> dict[str, Any]:
        # Copies (e.g. a domain sent to another process) start their own pool.
        return {"workers": self.workers, "timeout_s": self.timeout_s, "_pool": None, "_finalizer": None}

    def grade(self, reference: str, response: str) -> Grade:
        return self.grade_batch([reference], [response])[0]

    def grade_batch(self, references: Sequence[str], responses: Sequence[str]) -> list[Grade]:
        if len(references) != len(responses):
            raise ValueError(f"grade_batch: {len(references)} references but {len(responses)} responses")
        answers = [final_answer(r) for r in responses]
        correct = [False] * len(responses)
        todo = [i for i, a in enumerate(answers) if a]
        # math-verify's own alarms fire at timeout_s per parse/verify; the outer deadline covers a
        # worker stuck where the alarm cannot reach (three timed calls plus process overhead).
        deadline = 3 * self.timeout_s + 10
        while todo:
            pool = self._ensure_pool()
            pending = [
                (i, pool.apply_async(_worker_grade, (str(references[i]), answers[i], self.timeout_s)))
                for i in todo
            ]
            todo = []
            for n, (i, job) in enumerate(pending):
                try:
                    correct[i] = bool(job.get(timeout=deadline))
                except multiprocessing.TimeoutError:
                    # Item i is wrong; the pool may be wedged: restart it for the rest.
                    self.close()
                    todo = [j for j, _ in pending[n + 1 :]]
                    break
        # An empty `\boxed{}` is no answer either.
        return [Grade(correct=c, formatted=bool(a)) for c, a in zip(correct, answers, strict=True)]
