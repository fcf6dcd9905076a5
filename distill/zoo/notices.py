"""What a zoo build says and cleans up: the line before a build (what, for which data, where, how
long), the line after it, and the folders a killed build left behind.

A `domain.*` data override keys a zoo of its own (`build.recipe_key`): a different student and
teacher, built from scratch into the shared zoo folder. That is said before it happens.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from distill.config import domain_config as default_config
from distill.tracking.lock import pid_alive
from distill.zoo.recipes import ZooEntry

if TYPE_CHECKING:
    from distill.config import DomainBase


def built_notice(entry: ZooEntry) -> str:
    """`zoo: built student in 65 s, eval accuracy 45.0%` (Score / Success per task on sciworld)."""
    score = f", eval accuracy {entry.eval['accuracy']:.1%}" if "accuracy" in entry.eval else ""
    if "success" in entry.eval:  # a multi-turn agent (sciworld)
        tasks = [k.split("/")[1] for k in entry.eval if k.startswith("task/") and k.endswith("/success")]
        per_task = ", ".join(f"{t} {entry.eval[f'task/{t}/success']:.0%}" for t in tasks)
        score = f", eval Score {entry.eval['score']:.3f} Success {entry.eval['success']:.1%}"
        score += f" ({per_task})" if per_task else ""
    return f"zoo: built {entry.name} in {entry.seconds:.0f} s{score}"


def remove_stale_builds(target: Path) -> list[Path]:
    """Remove the `<entry>.tmp-<pid>` folders of builds whose process is gone (a SIGKILL leaves
    one behind); called under the entry's lock, so no live build of it is touched."""
    removed = []
    for tmp in target.parent.glob(f"{target.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and (int(pid) == os.getpid() or not pid_alive(int(pid))):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


# Build times measured on a 2-core CPU (docs/results.md, docs/dapo.md, docs/sciworld.md), per
# domain, for entries never built here before: a sciworld student takes three times rlve's.
TYPICAL_SECONDS: dict[str, dict[str, float]] = {
    "rlve": {
        "tok-qwen": 10,
        "tok-llama": 10,
        "student": 47,
        "student-privileged": 341,
        "teacher": 166,
        "teacher-llama": 320,
    },
    "dapo": {"tok-qwen": 10, "student-privileged": 382, "teacher": 403},
    "sciworld": {"tok-qwen": 41, "student": 129, "student-privileged": 138, "teacher": 237},
}


def typical_seconds(root: Path, name: str, domain: str) -> float | None:
    """How long building `name` takes: the median of this zoo's earlier builds of it for this
    domain, else the measured figure for this domain, else the median of its builds for any
    other domain (None: nothing known)."""

    def median_of(pattern: str) -> float | None:
        times = []
        for meta in root.glob(pattern):
            try:
                entry = ZooEntry.model_validate_json(meta.read_text())
            except (OSError, ValueError):
                continue
            if entry.name == name and entry.seconds > 0:
                times.append(entry.seconds)
        return sorted(times)[len(times) // 2] if times else None

    here = median_of(f"{domain}/{name}-*/zoo.json")
    if here is not None:
        return here
    measured = TYPICAL_SECONDS.get(domain, {}).get(name)
    return measured if measured is not None else median_of(f"*/{name}-*/zoo.json")


def changed_data_fields(domain_config: DomainBase, keyed: Iterable[str]) -> list[str]:
    """`domain.<field>=<value>` for each field the zoo is keyed on (`keyed`) that differs from the
    domain's default: each such change builds a zoo of its own."""
    fields = set(keyed)
    mine = domain_config.model_dump(mode="json", include=fields)
    default = default_config(domain_config.name).model_dump(mode="json", include=fields)
    return [f"domain.{key}={mine[key]}" for key in sorted(mine) if mine[key] != default.get(key)]


def build_notice(root: Path, name: str, domain_config: DomainBase, target: Path, keyed: Iterable[str]) -> str:
    """The one line said before a build: what is built, where, for which data, and how long it takes."""
    seconds = typical_seconds(root, name, domain_config.name)
    took = f"typically {seconds:.0f} s" if seconds is not None else "time unknown"
    changed = changed_data_fields(domain_config, keyed)
    if not changed:
        return f"zoo: building {name} for {domain_config.name} (first use; cached in {target.parent}; {took})"
    return (
        f"zoo: building a new {name} for {domain_config.name} data with {' '.join(changed)} (not the "
        f"default data, so the default {name} is not reused) into {target.parent}, {took}"
    )
