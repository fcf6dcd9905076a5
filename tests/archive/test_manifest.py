"""The manifest pins what a run started from (weights, tokenizer files and chat template by
content hash or hub revision; a dirty tree's diff), and `distill reproduce` refuses to re-run
from other starting weights."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distill.archive.hashing import Md5Cache, content_md5, text_md5
from distill.archive.manifest import git_diff, model_pin, start_differences
from distill.cli.app import app

from .conftest import copy_run


def _weights_only(model: Path, into: Path) -> Path:
    """A folder holding only the model's weight file: what its `weights` pin must hash like."""
    into.mkdir()
    shutil.copy(model / "model.safetensors", into / "model.safetensors")
    return into


def test_local_model_pin_hashes_weights_tokenizer_and_template(tmp_path: Path, tiny_zoo) -> None:
    from transformers import AutoTokenizer

    model = tmp_path / "student"
    shutil.copytree(tiny_zoo.student, model)
    template = AutoTokenizer.from_pretrained(model).chat_template
    assert template
    pin = model_pin(str(model), template)
    assert pin["source"] == "local" and pin["path"] == str(model.resolve())
    # The DVC hash of a folder with only the weights (what `dvc add` of it would record).
    assert pin["weights"] == content_md5(_weights_only(model, tmp_path / "w"))
    assert pin["tokenizer"].endswith(".dir") and pin["chat_template"] == text_md5(template)

    # A checkpoint's other files (optimizer, EMA teacher, trainer state) are not the model.
    (model / "optimizer.pt").write_bytes(b"other")
    (model / "ema_teacher.safetensors").write_bytes(b"other")
    assert model_pin(str(model), template) == pin

    data = bytearray((model / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (model / "model.safetensors").write_bytes(bytes(data))
    changed = model_pin(str(model), template + " ")
    assert changed["weights"] != pin["weights"] and changed["tokenizer"] == pin["tokenizer"]
    assert start_differences({"student": pin}, {"student": changed}) == [
        f"student weights {pin['weights'][:12]} then, {changed['weights'][:12]} now",
        f"student chat_template {pin['chat_template'][:12]} then, {changed['chat_template'][:12]} now",
    ]


def test_hub_model_pin_is_the_cached_revision(
    tmp_path: Path, tiny_zoo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub id loaded from the Hugging Face cache is pinned by the commit it was loaded at."""
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(tiny_zoo.student, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    pin = model_pin("org/tiny", "{{ messages }}")
    assert pin == {
        "path": "org/tiny",
        "source": "hub",
        "revision": commit,
        "chat_template": text_md5("{{ messages }}"),
    }
    assert model_pin("org/not-here", None)["revision"] is None


def test_md5_cache_reuses_hashes_until_a_file_changes(tmp_path: Path) -> None:
    blob = tmp_path / "w.bin"
    blob.write_bytes(b"a" * 100)
    cache = Md5Cache(tmp_path / "cache.json")
    first = cache.md5(blob)
    cache.save()
    again = Md5Cache(tmp_path / "cache.json")
    assert again.md5(blob) == first and not again.changed  # read from the cache file
    blob.write_bytes(b"b" * 101)
    assert again.md5(blob) == content_md5(blob) != first


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def test_git_diff_records_tracked_and_untracked_changes(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    assert git_diff("false", repo) == {}
    (repo / "a.py").write_text("x = 2\n")
    (repo / "new.py").write_text("token = 'not for the manifest'\n")
    recorded = git_diff("true", repo)
    diff = recorded["diff"]
    assert "-x = 1" in diff and "+x = 2" in diff
    # Untracked files are pinned by hash, their content never copied (it may be a secret).
    assert f"# untracked new.py: 31 bytes, md5 {content_md5(repo / 'new.py')}" in diff
    assert "not for the manifest" not in diff
    assert recorded["diff_md5"] == text_md5(diff) and recorded["diff_truncated"] is False
    # The recorded patch re-creates the tracked files' state from the commit.
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(repo), str(clone))
    subprocess.run(["git", "apply"], cwd=clone, input=diff, text=True, check=True)
    assert (clone / "a.py").read_text() == "x = 2\n"


@pytest.mark.integration
def test_run_manifest_pins_its_start_and_reproduce_refuses_other_weights(
    workspace: Path, tiny_run: Path, tiny_zoo, tmp_path: Path
) -> None:
    run_dir = copy_run(tiny_run, workspace)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    student, teacher = manifest["start"]["student"], manifest["start"]["teacher"]
    assert student["path"] == str(Path(tiny_zoo.student).resolve())
    assert student["weights"] == content_md5(_weights_only(tiny_zoo.student, tmp_path / "w"))
    assert teacher["source"] == "local" and teacher["weights"] != student["weights"]
    git = manifest["git"]
    if git["dirty"] == "true":
        assert git["diff_truncated"] or git["diff_md5"] == text_md5(git["diff"])

    # The run's config and pins point at a copy of the student; the copy then changes.
    copy = tmp_path / "student"
    shutil.copytree(tiny_zoo.student, copy)
    manifest["config"]["student"]["name"] = str(copy)
    manifest["start"]["student"] = {**student, "path": str(copy.resolve())}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["reproduce", run_dir.name])
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: run archive-source started from other models")
    assert f"student weights {student['weights'][:12]} then" in line and "teacher" not in line
    assert not [p for p in (workspace / "runs").iterdir() if "-repro-" in p.name]


def test_a_resume_refuses_models_that_changed_since_the_start(tmp_path: Path, tiny_zoo) -> None:
    """`check_same_start`, for the runner's resume path: the pins of the start and of now."""
    from distill.archive.manifest import check_same_start

    model = tmp_path / "teacher"
    shutil.copytree(tiny_zoo.teacher, model)
    start = {"start": {"teacher": model_pin(str(model), "t")}}
    check_same_start(start, {"start": {"teacher": model_pin(str(model), "t")}})
    check_same_start({}, start)  # a manifest from before the pins
    (model / "tokenizer.json").write_text((model / "tokenizer.json").read_text() + " ")
    with pytest.raises(ValueError, match="cannot be resumed as the same run: teacher tokenizer"):
        check_same_start(start, {"start": {"teacher": model_pin(str(model), "t")}})
