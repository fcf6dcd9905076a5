"""`manifest.json`: what it takes to re-create a run (config, versions, seeds, hardware, argv), where
each model ran (`models.<role>.device`), and what it started from: the content hashes (or hub revisions) of the student's and teacher's
weights, tokenizer files and chat template (`start`), and the diff of a dirty git tree (`git`).
`distill reproduce` refuses to re-run when the starting weights differ (`start_differences`).

`distill archive push` adds the content hashes of what it archived (`data_hashes`,
`checkpoint_hashes`, and `archive`: per-output DVC hashes, sizes and the redacted remote URL).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill import __version__
from distill.archive.hashing import Md5Cache, file_md5, files_md5, text_md5
from distill.settings import get_settings
from distill.tracking.mlflow import git_tags
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
# What a model folder's weights and tokenizer are (a distill checkpoint also holds optimizer,
# RNG and trainer state, and an OPSD one the EMA teacher: none of them is the model).
WEIGHT_FILES = (
    "model*.safetensors",
    "model*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model*.bin.index.json",
    "consolidated*.safetensors",
    "adapter_model.*",
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
# A dirty tree's diff larger than this is kept in part (its hash covers all of it).
DIFF_LIMIT = 1 << 20


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


def model_record(engine: Engine) -> dict[str, Any]:
    """What the manifest says of one model: its engine's `describe()`, always with a `device`
    (where its weights are: `cpu`, `cuda:N`, or `server` for a model behind an HTTP server); a
    teacher that scored in its worker process (rollout.async_teacher) says so itself, with the
    worker's device as `device` and `worker_device` (engines/worker.py)."""
    record = dict(engine.describe())
    record.setdefault("device", "server" if record.get("engine") == "server" else "unknown")
    return record


def build_manifest(
    config: RunConfig,
    argv: list[str],
    mlflow_run_id: str,
    student: Engine,
    teacher: Engine,
    teachers: dict[str, Engine] | None = None,
) -> dict[str, Any]:
    """The manifest of a run about to train, each model's record read from its own engine.
    `teachers`: each domain's teacher of a run over several domains, each recorded and pinned as
    `teacher@<domain>`."""
    git = git_tags()
    others = {f"teacher@{part}": engine for part, engine in (teachers or {}).items()}
    models = {"student": model_record(student), "teacher": model_record(teacher)}
    models.update({role: model_record(engine) for role, engine in others.items()})
    return {
        "distill_version": __version__,
        "argv": list(argv),
        "config": config.model_dump(mode="json"),
        "seeds": {"seed": config.seed, "eval_seed": config.domain.eval_seed},
        "git": {"sha": git.get("git.sha"), "dirty": git.get("git.dirty"), **git_diff(git.get("git.dirty"))},
        "packages": package_versions(),
        "hardware": hardware(),
        "models": models,
        "start": start_pins(
            {
                role: (str(engine.describe().get("path") or ""), engine.tokenizer.chat_template)
                for role, engine in (("student", student), ("teacher", teacher), *others.items())
            }
        ),
        "mlflow_run_id": mlflow_run_id,
    }


def md5_cache() -> Md5Cache:
    """The workspace's cache of file hashes (see `Md5Cache`)."""
    return Md5Cache(get_settings().workspace / ".cache" / "file-md5.json")


def start_pins(models: dict[str, tuple[str, str | None]]) -> dict[str, dict[str, Any]]:
    """role -> the pin of the model it starts from; `models`: role -> (path or hub id, the chat
    template its tokenizer uses)."""
    cache = md5_cache()
    try:
        return {role: model_pin(path, template, cache) for role, (path, template) in models.items()}
    finally:
        cache.save()


def model_pin(path: str, chat_template: str | None, cache: Md5Cache | None = None) -> dict[str, Any]:
    """A local model folder: the DVC-style hashes of its weight files and tokenizer files; a hub
    id: the commit it was loaded at (content-addressed: it pins every file). Both: the md5 of the
    chat template the tokenizer renders with (wherever it came from)."""
    pin: dict[str, Any] = {"path": path}
    folder = Path(path)
    if path and folder.is_dir():
        pin.update(
            path=str(folder.resolve()),
            source="local",
            weights=files_md5(folder, WEIGHT_FILES, cache),
            tokenizer=files_md5(folder, TOKENIZER_FILES, cache),
        )
    else:
        pin.update(source="hub", revision=hub_revision(path))
    pin["chat_template"] = text_md5(chat_template) if chat_template else None
    return pin


def hub_revision(repo_id: str) -> str | None:
    """The commit of `repo_id` in the local Hugging Face cache (what transformers loaded); None
    when it is not there."""
    try:
        from huggingface_hub import try_to_load_from_cache

        for name in ("config.json", "tokenizer_config.json"):
            found = try_to_load_from_cache(repo_id, name)
            if isinstance(found, str):
                return Path(found).parent.name  # .../snapshots/<commit>/<file>
    except Exception:  # not a valid repo id: nothing to pin
        return None
    return None


# What must equal the manifest's pin for a re-run to start from the same place.
PINNED = ("weights", "tokenizer", "chat_template", "revision")


def start_differences(recorded: dict[str, Any], current: dict[str, dict[str, Any]]) -> list[str]:
    """`role key: then -> now` for every pinned hash that differs (empty: same starting point)."""
    out = []
    for role, now in current.items():
        then = recorded.get(role)
        if not isinstance(then, dict):
            continue
        for key in PINNED:
            if key in then and then.get(key) != now.get(key):
                out.append(f"{role} {key} {_short(then.get(key))} then, {_short(now.get(key))} now")
    return out


def check_same_start(previous: dict[str, Any], manifest: dict[str, Any]) -> None:
    """On resume: the models must be the ones the run started from (a rebuilt zoo or an edited
    folder would give the rest of the run another teacher - or, for OPSD, another step-0 copy).
    Raises ValueError naming what differs; a manifest from before the pins passes."""
    before = previous.get("start")
    if not isinstance(before, dict):
        return
    differences = start_differences(before, manifest.get("start", {}))
    if differences:
        raise ValueError(
            "the run's models changed since it started, so it cannot be resumed as the same run: "
            + "; ".join(differences)
        )


def _short(value: Any) -> str:
    return str(value)[:12] if value else "unknown"


def git_diff(dirty: str | None, cwd: Path | None = None) -> dict[str, Any]:
    """A dirty tree's changes against HEAD: the tracked files' patch (what `git apply` takes) and
    one line per untracked file with its size and md5, and the md5 of all of it. Untracked files
    are pinned, not copied: one the user forgot to ignore may hold a secret, and the manifest goes
    to MLflow and the DVC remote. Nothing for a clean tree."""
    if dirty != "true":
        return {}
    where = cwd if cwd is not None else Path(__file__).resolve().parents[2]
    try:
        tracked = _git(["diff", "HEAD", "--binary"], where)
        others = _git(["ls-files", "--others", "--exclude-standard", "-z"], where)
    except (OSError, subprocess.SubprocessError):
        return {}
    parts = [tracked]
    for name in sorted(n for n in others.split("\0") if n):
        path = where / name
        if path.is_file():
            parts.append(f"# untracked {name}: {path.stat().st_size} bytes, md5 {file_md5(path)}\n")
    diff = "".join(parts)
    return {
        "diff_md5": text_md5(diff),
        "diff": diff[:DIFF_LIMIT],
        "diff_truncated": len(diff) > DIFF_LIMIT,
    }


def _git(args: list[str], cwd: Path, ok: tuple[int, ...] = (0,)) -> str:
    # Replaced, not refused: a tracked file in another encoding still gets a diff and a hash.
    proc = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, encoding="utf-8", errors="replace", timeout=60
    )
    if proc.returncode not in ok:
        raise subprocess.SubprocessError(proc.stderr.strip())
    return proc.stdout


def read_manifest(run_dir: Path) -> dict[str, Any]:
    return RunDir(run_dir).read_manifest()


def update_manifest(run_dir: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Merge `fields` into manifest.json (replaced, never written into: see RunDir.write_manifest)."""
    run = RunDir(run_dir)
    manifest = run.read_manifest()
    manifest.update(fields)
    run.write_manifest(manifest)
    return manifest
