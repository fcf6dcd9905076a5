"""DVC-compatible content hashes, recomputed from the files themselves.

DVC's md5 of a file is the md5 of its bytes; of a directory, the md5 of the JSON list
`[{"md5": ..., "relpath": ...}]` sorted by path, plus `.dir` (dvc_data `Tree.as_bytes`). `verify`
re-hashes here rather than asking DVC, whose state database skips files whose size and mtime did
not change, and a checkpoint hash per `step-N` is the hash `dvc add checkpoints/step-N` would give.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

CHUNK = 1 << 20

Listing = list[dict[str, str]]


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def dir_listing(path: Path) -> Listing:
    """Every file under `path` with its md5, sorted by relative path (DVC's order)."""
    rows = []
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = Path(dirpath) / name
            rows.append({"md5": file_md5(full), "relpath": full.relative_to(path).as_posix()})
    return sorted(rows, key=lambda row: row["relpath"])


def listing_md5(listing: Listing) -> str:
    rows = sorted(({"md5": r["md5"], "relpath": r["relpath"]} for r in listing), key=lambda r: r["relpath"])
    blob = json.dumps(rows, sort_keys=True).encode("utf-8")
    return hashlib.md5(blob, usedforsecurity=False).hexdigest() + ".dir"


def content_md5(path: Path) -> str:
    return listing_md5(dir_listing(path)) if path.is_dir() else file_md5(path)


def sub_listing(listing: Listing, prefix: str) -> Listing:
    """The part of a directory listing under `prefix/`, with paths relative to it."""
    head = prefix.rstrip("/") + "/"
    return [
        {"md5": r["md5"], "relpath": r["relpath"][len(head) :]}
        for r in listing
        if r["relpath"].startswith(head)
    ]


def checkpoint_hashes(listing: Listing) -> dict[str, str]:
    """`step-N` -> the DVC hash of that checkpoint folder, from the `checkpoints/` listing."""
    steps = sorted({r["relpath"].split("/", 1)[0] for r in listing if "/" in r["relpath"]})
    return {step: listing_md5(sub_listing(listing, step)) for step in steps}


def diff_listings(recorded: Listing, actual: Listing) -> dict[str, list[str]]:
    """Files changed, missing or added relative to the recorded listing."""
    old = {r["relpath"]: r["md5"] for r in recorded}
    new = {r["relpath"]: r["md5"] for r in actual}
    return {
        "modified": sorted(p for p in old.keys() & new.keys() if old[p] != new[p]),
        "missing": sorted(old.keys() - new.keys()),
        "added": sorted(new.keys() - old.keys()),
    }


def read_listing(path: Path) -> Listing | None:
    """A `.dir` object (DVC cache file) as a listing; None when absent or unreadable."""
    try:
        raw: Any = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, list):
        return None
    return [{"md5": str(r["md5"]), "relpath": str(r["relpath"])} for r in raw if "md5" in r]


class Md5Cache:
    """File md5s keyed by (path, size, mtime, inode), kept in a JSON file between runs: a run
    pins its starting weights at every start and resume, and re-reading a 64 GB teacher each time
    would cost minutes (DVC keeps a state database for the same reason)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        self.changed = False
        if path is not None:
            try:
                loaded = json.loads(path.read_text())
                self.entries = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self.entries = {}

    def md5(self, file: Path) -> str:
        stat = file.stat()
        key = str(file.resolve())
        stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
        hit = self.entries.get(key)
        if isinstance(hit, dict) and hit.get("stat") == stamp:
            return str(hit["md5"])
        digest = file_md5(file)
        self.entries[key] = {"stat": stamp, "md5": digest}
        self.changed = True
        return digest

    def save(self) -> None:
        if self.path is None or not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.entries))
            os.replace(tmp, self.path)  # two runs starting at once: the last one's cache wins
        except OSError:
            pass  # a cache that cannot be written only costs the next run a re-read
        self.changed = False


def files_md5(folder: Path, patterns: tuple[str, ...], cache: Md5Cache | None = None) -> str | None:
    """The DVC-style `.dir` hash of the files directly in `folder` whose names match `patterns`
    (the hash `dvc add` gives a folder holding only them); None when none matches."""
    import fnmatch

    rows = []
    for child in sorted(folder.iterdir()) if folder.is_dir() else []:
        if child.is_file() and any(fnmatch.fnmatch(child.name, p) for p in patterns):
            rows.append({"md5": cache.md5(child) if cache else file_md5(child), "relpath": child.name})
    return listing_md5(rows) if rows else None


def text_md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()
