"""`manifest.json`: what it takes to re-create a run (config, versions, seeds, hardware, argv).

`distill archive push` adds the content hashes of what it archived (`data_hashes`,
`checkpoint_hashes`, and `archive`: per-output DVC hashes, sizes and the redacted remote URL).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill import __version__

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.engines.hf import HFEngine

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


def _model_info(engine: HFEngine) -> dict[str, Any]:
    if getattr(engine, "engine", "hf") == "server":  # a served teacher: no weights in this process
        return engine.describe()  # type: ignore[attr-defined,no-any-return]
    model = engine.model
    return {
        "path": str(model.name_or_path),
        "class": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "vocab": len(engine.tokenizer),
    }


def build_manifest(
    config: RunConfig, argv: list[str], mlflow_run_id: str, student: HFEngine, teacher: HFEngine
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
        "models": {"student": _model_info(student), "teacher": _model_info(teacher)},
        "mlflow_run_id": mlflow_run_id,
    }


def read_manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} is missing (the run never got past loading its models?)") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def update_manifest(run_dir: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Merge `fields` into manifest.json, replacing the file rather than writing into it: an archived
    manifest may be a hardlink into the DVC cache, which an in-place write would corrupt."""
    manifest = read_manifest(run_dir)
    manifest.update(fields)
    tmp = run_dir / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, run_dir / "manifest.json")
    return manifest
