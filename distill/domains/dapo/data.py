"""Math problem sets: the benchmarks (AIME24/25, HMMT25; named in registry.py) and training data
(DAPO-Math-17k).

Everything arrives through one loader, `load_problems(source)`, from

- a Hugging Face dataset id (needs a network or the local datasets cache),
- a local file: a JSON list, JSON lines or parquet, whose rows are in one of the layouts below,
- a local folder: MathArena's `answers.csv` + `problems/<id>.tex`, or data files loaded in name order.

Row layouts: verl (`prompt[0].content`, `reward_model.ground_truth`; DAPO-Math-17k), RLVE's
benchmark files (`user_prompt`, `ground_truth`) and plain (`problem`, `answer`, optional `solution`).
A malformed row is an error naming the file and the row, never a skipped item.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path
from typing import Any

from distill.domains.base import Item
from distill.registry import BENCHMARKS

# Appended to a problem that does not already ask for a boxed answer (Qwen's math prompt).
BOXED_INSTRUCTION = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."

# DAPO-Math-17k's own wrapper asks for "Answer: ..." lines: it is stripped, the boxed
# instruction replaces it, so every source is graded the same way.
_DAPO_HEAD = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.S)
_DAPO_TAIL = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")

DATA_SUFFIXES = (".json", ".jsonl", ".parquet")


# The DAPO-Math-17k training set on the hub (verl layout).
DAPO_HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"


class DataError(ValueError):
    """A problem set that cannot be read: names the file (and the row)."""


def problem_prompt(problem: str) -> str:
    """The user message for a problem: its text plus the boxed-answer instruction."""
    problem = _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", problem.strip()))
    if "\\boxed" in problem:
        return problem
    return problem + BOXED_INSTRUCTION


def _text(value: Any, where: str, field: str) -> str:
    if isinstance(value, bool) or value is None:
        raise DataError(f"{where}: field {field!r} is missing or empty")
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field {field!r} must be non-empty text, got {value!r}")
    return value.strip()


def row_to_item(row: Any, where: str, index: int, prefix: str) -> Item:
    """One row in any supported layout -> Item (`where` names file and row in errors)."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    solution = row["solution"] if isinstance(row.get("solution"), str) else None
    meta: dict[str, Any] = row["meta"] if isinstance(row.get("meta"), dict) else {}
    if "prompt" in row and "reward_model" in row:
        prompt = row["prompt"]
        if not isinstance(prompt, list | tuple) or not prompt or not isinstance(prompt[0], dict):
            raise DataError(f"{where}: field 'prompt' must be a list of chat messages (verl layout)")
        problem = _text(prompt[0].get("content"), where, "prompt[0].content")
        reward = row["reward_model"]
        if not isinstance(reward, dict):
            raise DataError(f"{where}: field 'reward_model' must be an object with 'ground_truth'")
        answer = _text(reward.get("ground_truth"), where, "reward_model.ground_truth")
        extra: dict[str, Any] = row["extra_info"] if isinstance(row.get("extra_info"), dict) else {}
        ident = extra.get("index", index)
    elif "user_prompt" in row:
        problem = _text(row["user_prompt"], where, "user_prompt")
        answer = _text(row.get("ground_truth", row.get("reference_answer")), where, "ground_truth")
        ident = row.get("id", index)
    elif "problem" in row:
        problem = _text(row["problem"], where, "problem")
        answer = _text(row.get("answer"), where, "answer")
        ident = row.get("id", row.get("problem_idx", index))
    else:
        raise DataError(
            f"{where}: unknown row layout (keys {sorted(row)}); expected verl "
            "(prompt[0].content, reward_model.ground_truth), RLVE (user_prompt, ground_truth) "
            "or plain (problem, answer)"
        )
    return Item(
        id=f"{prefix}-{ident}", prompt=problem_prompt(problem), answer=answer, solution=solution, meta=meta
    )


def _read_parquet(path: Path) -> list[Any]:
    import pyarrow.parquet as pq

    try:
        return list(pq.read_table(path).to_pylist())
    except OSError as exc:
        if not path.exists() or not os.access(path, os.R_OK):
            raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
        # pyarrow reports some broken files as an OSError (ArrowIOError) too.
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    except Exception as exc:  # pyarrow's own error types on a broken file
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None


def _read_rows(path: Path) -> list[Any]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    text = _utf8(path)
    if suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}: line {n} is not valid JSON ({exc.msg})") from None
        return rows
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of problems, got {type(data).__name__}")
        return data
    raise DataError(f"{path}: unsupported file type {suffix!r}; use one of {', '.join(DATA_SUFFIXES)}")


def load_file(path: Path, prefix: str) -> list[Item]:
    rows = _read_rows(path)
    # Rows without an id are numbered from 1, as the problems of a contest are.
    return [row_to_item(row, f"{path}: row {i}", i + 1, prefix) for i, row in enumerate(rows)]


def load_matharena(folder: Path, prefix: str) -> list[Item]:
    """MathArena's layout: `answers.csv` (id,answer) and `problems/<id>.tex`."""
    answers = folder / "answers.csv"
    items = []
    reader = csv.DictReader(io.StringIO(_utf8(answers), newline=""))
    if not reader.fieldnames or not {"id", "answer"} <= set(reader.fieldnames):
        raise DataError(f"{answers}: expected the columns id,answer; got {reader.fieldnames}")
    for n, row in enumerate(reader, start=2):
        where = f"{answers}: line {n}"
        ident = _text(row["id"], where, "id")
        tex = folder / "problems" / f"{ident}.tex"
        if not tex.is_file():
            raise DataError(f"{where}: problem file {tex} is missing")
        problem = _utf8(tex)
        item = row_to_item({"problem": problem, "answer": row["answer"], "id": ident}, where, n, prefix)
        items.append(item)
    return items


def _utf8(path: Path) -> str:
    """A text file's contents; one DataError naming the file when it is unreadable or not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start]
        raise DataError(f"{path}: not UTF-8 text (byte 0x{bad:02x} at offset {exc.start})") from None


def load_hub(dataset_id: str, split: str, prefix: str) -> list[Item]:
    """A Hugging Face dataset (id or a local dataset folder) through `datasets.load_dataset`."""
    import datasets

    try:
        data = datasets.load_dataset(dataset_id, split=split)
    except Exception as exc:
        raise DataError(
            f"cannot load dataset {dataset_id!r} (split {split}): {type(exc).__name__}: {exc}. "
            "Offline? Give a local file or folder instead (JSON list, JSON lines, parquet, "
            "or MathArena's answers.csv + problems/)"
        ) from None
    return [row_to_item(dict(row), f"{dataset_id}: row {i}", i + 1, prefix) for i, row in enumerate(data)]


def load_problems(source: str | Path, prefix: str, split: str = "train") -> list[Item]:
    """Problems from a local file or folder, else from a hub dataset id."""
    path = Path(source).expanduser()
    if path.is_file():
        return load_file(path, prefix)
    if path.is_dir():
        if (path / "answers.csv").exists():
            return load_matharena(path, prefix)
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in DATA_SUFFIXES)
        if files:
            return [item for f in files for item in load_file(f, prefix)]
        # A saved hub dataset folder (e.g. from `huggingface-cli download`) goes through datasets.
        return load_hub(str(path), split, prefix)
    if str(source).startswith((".", "/", "~")) or path.suffix.lower() in DATA_SUFFIXES:
        raise DataError(f"{source}: no such file or folder")
    return load_hub(str(source), split, prefix)


def load_benchmark(name: str, data: str | Path | None = None) -> list[Item]:
    """A named benchmark (registry.py), from `data` (file or folder) when given, else its hub id."""
    bench = BENCHMARKS.get(name)
    if bench is None or bench.domain != "dapo" or bench.hub_id is None:
        known = [n for n, b in BENCHMARKS.items() if b.domain == "dapo"]
        raise DataError(f"unknown benchmark {name!r}; known: {', '.join(known)}")
    items = load_problems(data if data is not None else bench.hub_id, name, bench.split)
    if not items:
        raise DataError(f"benchmark {name}: {data or bench.hub_id} holds no problems")
    return items
