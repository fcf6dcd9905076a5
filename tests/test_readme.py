"""The README stays a user's page: at most 150 lines, no dated measurement (those live in
docs/results.md and the topic docs), and every repository path it names exists in this checkout."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 150
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
# A path into the repository: one of its folders, then anything up to a space, quote or bracket.
# Not preceded by a path character, so `workspace/runs/...` or a hub id never counts.
FOLDER_PATH = re.compile(
    r"(?<![\w./~-])((?:distill|docs|configs|benchmarks|scripts|tests|\.ci)/[^\s`'\"()\[\],;|]*)"
)
# Top-level files are named bare (`Makefile`, `pyproject.toml`); a user's own `my.yaml` is not one.
TOP_FILE = re.compile(
    r"(?<![\w./-])(Makefile|pyproject\.toml|dvc\.yaml|dvc\.lock|params\.yaml|README\.md|DESIGN\.md"
    r"|LICENSE|CHANGELOG\.md|CONTRIBUTING\.md|setup\.py|setup\.cfg|uv\.lock|requirements[\w-]*\.txt)(?![\w/-])"
)


def named_paths(text: str) -> list[str]:
    """Every repository path `text` names, as written (placeholders such as `<domain>` kept)."""
    found = [m.rstrip(".:") for m in FOLDER_PATH.findall(text)]
    return found + TOP_FILE.findall(text)


def exists(path: str, root: Path = ROOT) -> bool:
    """The path is in the checkout; `<placeholder>` and `*` stand for any one name and must match one."""
    pattern = re.sub(r"<[^>/]*>", "*", path).rstrip("/")
    if "*" in pattern:
        return any(root.glob(pattern))
    return (root / pattern).exists()


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    return sorted({p for p in named_paths(text) if not exists(p, root)})


def dated_lines(text: str) -> list[str]:
    return [f"{n}: {line[:80]}" for n, line in enumerate(text.splitlines(), 1) if DATE.search(line)]


def test_the_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"


def test_the_readme_carries_no_dates() -> None:
    dated = dated_lines(README.read_text())
    assert not dated, "dated lines belong in docs/results.md:\n" + "\n".join(dated)


def test_every_path_the_readme_names_exists() -> None:
    missing = missing_paths(README.read_text())
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checks themselves: a stale file, a stale folder, a placeholder that matches nothing and a
    top-level file are caught; a placeholder that matches, a workspace path, a hub id and a user's
    own file are not."""
    (tmp_path / "configs" / "rlve").mkdir(parents=True)
    (tmp_path / "configs" / "rlve" / "opd.yaml").write_text("")
    (tmp_path / "distill" / "config").mkdir(parents=True)
    text = (
        "defaults in `distill/config.py`; presets in configs/<domain>/<method>.yaml, see\n"
        "docs/gone.md. `workspace/runs/<id>/config.yaml`, Qwen/Qwen3-1.7B, --config my.yaml;\n"
        "distill/config/ holds them; configs/<domain>/<method>.json; the Makefile.\n"
    )
    assert named_paths(text) == [
        "distill/config.py",
        "configs/<domain>/<method>.yaml",
        "docs/gone.md",
        "distill/config/",
        "configs/<domain>/<method>.json",
        "Makefile",
    ]
    assert missing_paths(text, tmp_path) == [
        "Makefile",
        "configs/<domain>/<method>.json",
        "distill/config.py",
        "docs/gone.md",
    ]
    assert dated_lines("measured 2026-12-04, 9 min\nno date here\n") == ["1: measured 2026-12-04, 9 min"]
