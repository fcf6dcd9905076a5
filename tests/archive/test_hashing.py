"""Our re-hashing agrees with DVC's own hashes; remote URLs never carry secrets into records."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from distill.archive.dvcrepo import ArchiveError, open_archive, redact_url
from distill.archive.hashing import (
    checkpoint_hashes,
    content_md5,
    diff_listings,
    dir_listing,
    listing_md5,
)
from distill.settings import Settings


def _dvc_hash(root: Path, target: Path) -> str:
    from dvc.repo import Repo

    if not (root / ".dvc").exists():
        Repo.init(str(root), no_scm=True).close()
    with Repo(str(root)) as repo:
        [stage] = repo.add([str(target)])
        return str(stage.outs[0].hash_info.value)


def _tree(folder: Path) -> None:
    for step in (1, 2):
        ckpt = folder / f"step-{step}"
        (ckpt / "nested").mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(os.urandom(3000 + step))
        (ckpt / "config.json").write_text('{"a": 1}\n')
        (ckpt / "nested" / "rng_state.pth").write_bytes(b"\x00\x01" * step)


def test_directory_and_checkpoint_hashes_equal_dvc(tmp_path: Path) -> None:
    _tree(tmp_path / "a" / "checkpoints")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    listing = dir_listing(tmp_path / "a" / "checkpoints")
    assert [r["relpath"] for r in listing][:3] == [
        "step-1/config.json",
        "step-1/model.safetensors",
        "step-1/nested/rng_state.pth",
    ]
    assert listing_md5(listing) == _dvc_hash(tmp_path / "a", tmp_path / "a" / "checkpoints")
    per_step = checkpoint_hashes(listing)
    assert set(per_step) == {"step-1", "step-2"} and per_step["step-1"] != per_step["step-2"]
    # The per-checkpoint hash is what `dvc add checkpoints/step-2` gives.
    assert per_step["step-2"] == _dvc_hash(tmp_path / "b", tmp_path / "b" / "checkpoints" / "step-2")
    single = tmp_path / "a" / "checkpoints" / "step-1" / "config.json"
    shutil.copy(single, tmp_path / "b" / "one.json")
    assert content_md5(single) == _dvc_hash(tmp_path / "b", tmp_path / "b" / "one.json")


def test_diff_listings_names_changed_files() -> None:
    old = [{"md5": "1", "relpath": "a"}, {"md5": "2", "relpath": "b"}, {"md5": "3", "relpath": "c"}]
    new = [{"md5": "1", "relpath": "a"}, {"md5": "9", "relpath": "b"}, {"md5": "4", "relpath": "d"}]
    assert diff_listings(old, new) == {"modified": ["b"], "missing": ["c"], "added": ["d"]}
    assert listing_md5(old) != listing_md5(new)


def test_redact_url_drops_passwords_and_query_strings() -> None:
    assert redact_url("s3://bucket/runs") == "s3://bucket/runs"
    assert redact_url("ssh://alice:hunter2@host:2222/srv/dvc") == "ssh://alice@host:2222/srv/dvc"
    assert redact_url("https://host/store?sig=TOKEN&x=1") == "https://host/store"
    assert redact_url("/data/dvc-remote") == "/data/dvc-remote"
    assert "hunter2" not in redact_url("webdavs://bob:hunter2@example.org/dav")


def test_a_remote_url_with_a_password_is_refused(tmp_path: Path) -> None:

    settings = Settings(workspace=tmp_path / "ws", remote="ssh://alice:hunter2@host/srv/dvc")
    with pytest.raises(ArchiveError, match="carries a password") as info:
        open_archive(settings)
    assert "hunter2" not in str(info.value) and "ssh://alice@host/srv/dvc" in str(info.value)
    assert "hunter2" not in (tmp_path / "ws" / ".dvc" / "config").read_text()
