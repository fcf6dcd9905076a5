"""The AgentGym SciWorld item index and the item lists drawn from it.

AgentGym numbers its items (`sciworld_<idx>`) by walking ScienceWorld's `env.tasks` in order,
skipping seven task types (5-1, 5-2, 9-1, 9-2, 9-3, 10-1, 10-2), and expanding every variation
of each remaining task. The official 200-item test list is a JSON of such ids.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_TASKS = ("5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2")
SAMPLE_SIZE = 200


@dataclass(frozen=True)
class IndexEntry:
    index: int
    task_id: str  # "4-2"
    task_name: str  # "find-non-living-thing"
    variation: int

    @property
    def item_id(self) -> str:
        return f"sciworld_{self.index}"


def task_table() -> dict[str, str]:
    """ScienceWorld's task ids -> task names, in `env.tasks` order."""
    from scienceworld.constants import ID2TASK

    return dict(ID2TASK)


def task_name(task_id: str) -> str:
    table = task_table()
    if task_id not in table:
        raise ValueError(f"unknown ScienceWorld task id {task_id!r}; known: {', '.join(table)}")
    return table[task_id]


def build_index(max_variations: dict[str, int]) -> list[IndexEntry]:
    """The AgentGym index from the simulator's variation counts (keyed by task name)."""
    entries: list[IndexEntry] = []
    for task_id, name in task_table().items():
        if task_id in EXCLUDED_TASKS:
            continue
        for variation in range(max_variations[name]):
            entries.append(IndexEntry(len(entries), task_id, name, variation))
    return entries


def parse_item_id(raw: object, source: str) -> int:
    if isinstance(raw, dict):
        raw = raw.get("item_id", raw.get("id"))
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("sciworld_"):
            text = text[len("sciworld_") :]
        if text.isdigit():
            return int(text)
    raise ValueError(f"{source}: {raw!r} is not a sciworld item id (expected 'sciworld_<idx>')")


def read_item_list(path: Path, index: list[IndexEntry]) -> list[IndexEntry]:
    """Items named in a JSON list of `sciworld_<idx>` ids (or of objects with an `item_id`)."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read item list {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"item list {path} is not valid JSON: {exc}") from None
    if isinstance(data, dict):
        data = data.get("items", data.get("item_ids"))
    if not isinstance(data, list) or not data:
        raise ValueError(f"item list {path} must be a non-empty JSON list of 'sciworld_<idx>' ids")
    out = []
    for position, raw in enumerate(data):
        idx = parse_item_id(raw, f"{path} entry {position}")
        if not 0 <= idx < len(index):
            raise ValueError(
                f"{path} entry {position}: sciworld_{idx} is outside the index (0..{len(index) - 1})"
            )
        out.append(index[idx])
    return out


def stratified_sample(index: list[IndexEntry], n: int = SAMPLE_SIZE, seed: int = 0) -> list[IndexEntry]:
    """`n` items spread as evenly as the task types allow, variations drawn with `seed`."""
    by_task: dict[str, list[IndexEntry]] = defaultdict(list)
    for entry in index:
        by_task[entry.task_id].append(entry)
    tasks = list(by_task)
    rng = random.Random(seed)
    quota = dict.fromkeys(tasks, 0)
    remaining = min(n, len(index))
    # Round-robin allocation, capped by each task's variation count.
    while remaining:
        progressed = False
        for task in tasks:
            if remaining and quota[task] < len(by_task[task]):
                quota[task] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            break
    chosen: list[IndexEntry] = []
    for task in tasks:
        chosen += sorted(rng.sample(by_task[task], quota[task]), key=lambda e: e.index)
    return chosen
