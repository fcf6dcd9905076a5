"""`distill --help`, each command's help and tab completion answer without the config models
(pydantic schemas): they are what a user waits for at the prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHECK = """
import json, os, sys
from distill.cli.app import main

out = {}
for argv, env in json.loads(sys.argv[1]):
    os.environ.pop("_DISTILL_COMPLETE", None)
    os.environ.update(env)
    sys.argv = ["distill", *argv]
    try:
        main()
    except SystemExit:
        pass
    out[" ".join(argv) or env.get("COMP_WORDS", "")] = "distill.config" in sys.modules
print("LOADED=" + json.dumps(out))
"""


def _complete(words: str) -> tuple[list[str], dict[str, str]]:
    return [], {
        "_DISTILL_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
    }


def test_help_and_completion_do_not_load_the_config_models(tmp_path: Path) -> None:
    cases = [
        (["--help"], {}),
        (["run", "--help"], {}),
        (["eval", "--help"], {}),
        (["diagnose", "--help"], {}),
        (["archive", "--help"], {}),
        (["zoo", "build", "--help"], {}),
        _complete("distill ru"),
        _complete("distill run --dom"),
    ]
    env = {**os.environ, "DISTILL_WORKSPACE": str(tmp_path / "ws")}
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("LOADED=")]
    assert json.loads(line[len("LOADED=") :]) == {
        "--help": False,
        "run --help": False,
        "eval --help": False,
        "diagnose --help": False,
        "archive --help": False,
        "zoo build --help": False,
        "distill ru": False,
        "distill run --dom": False,
    }
    # The completions themselves: the commands, then a command's options.
    words = proc.stdout.split()
    assert {"run", "runs", "--domain"} <= set(words), proc.stdout
