"""`manifest.json`: what it takes to re-create a run (config, versions, seeds, hardware, argv).

`distill archive push` adds the content hashes of what it archived (`data_hashes`,
`checkpoint_hashes`, and `archive`: per-output DVC hashes, sizes and the redacted remote URL).
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill import __version__
from distill.tracking.rundir import RunDir

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.engines.base import Engine

PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "datasets",
    "tokenizers",
    "mlflow",
    "dvc",
    "vllm",
    "rlve-gym",
    "math-verify",
    "scienceworld",
    "peft",
)


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def hardware() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def build_manifest(
    config: RunConfig, argv: list[str], mlflow_run_id: str, student: Engine, teacher: Engine
) -> dict[str, Any]:
    from distill.tracking.mlflow import git_tags

    git = git_tags()
    return {
        "distill_version": __version__,
        "argv": list(argv),
        "config": config.model_dump(mode="json"),
        "seeds": {"seed": config.seed, "eval_seed": config.domain.eval_seed},
        "git": {"sha": git.get("git.sha"), "dirty": git.get("git.dirty")},
        "packages": package_versions(),
        "hardware": hardware(),
        "models": {"student": student.describe(), "teacher": teacher.describe()},
        "mlflow_run_id": mlflow_run_id,
    }


def read_manifest(run_dir: Path) -> dict[str, Any]:
    return RunDir(run_dir).read_manifest()


def update_manifest(run_dir: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Merge `fields` into manifest.json (replaced, never written into: see RunDir.write_manifest)."""
    run = RunDir(run_dir)
    manifest = run.read_manifest()
    manifest.update(fields)
    run.write_manifest(manifest)
    return manifest
