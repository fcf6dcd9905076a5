"""The MLflow side of `distill archive push`, in a child process started before DVC's work.

Importing mlflow and opening its sqlite store cost ~4 s of single-threaded Python whatever the
checkpoint size, about what DVC needs to hash and push 500 MB. On a thread that work competes
with DVC's for the GIL and the two add up; in a process of its own it runs on the other core, so
a push costs about the larger of the two (benchmarks/archive_push.py). The parent sends one JSON
line per run (tags + the manifest to log as an artifact) and waits for the child's answer, so a
push still reports only what MLflow has recorded, and an MLflow failure fails the push.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from distill.archive.dvcrepo import ArchiveError
from distill.tracking.mlflow import client_for, tag_run


class MlflowTagger:
    """A child process that has imported mlflow and opened `uris`' stores, tagging runs on request."""

    def __init__(self, uris: list[str]) -> None:
        self.uris = sorted(set(uris))
        self._proc: subprocess.Popen[str] | None = None
        if self.uris:
            # stderr inherited: the child's warnings and a failed import reach the user as they are.
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "distill.archive.tagger", *self.uris],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )

    def tag(self, uri: str, run_id: str, tags: dict[str, str], artifact: Path) -> None:
        """Set `tags` on MLflow run `run_id` in `uri` and log `artifact` to it; raises on failure."""
        proc = self._proc
        if proc is None or uri not in self.uris:
            # A store this tagger was not opened for: a one-off child for it.
            with MlflowTagger([uri]) as other:
                other.tag(uri, run_id, tags, artifact)
            return
        assert proc.stdin is not None and proc.stdout is not None
        job = {"uri": uri, "run_id": run_id, "tags": tags, "artifact": str(artifact)}
        try:
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise ArchiveError(
                f"MLflow tagging of run {run_id} in {uri}: the tagging process exited ({proc.wait()}); see its error above"
            )
        answer = json.loads(line)
        if not answer.get("ok"):
            raise ArchiveError(f"MLflow tagging of run {run_id} in {uri} failed: {answer.get('error')}")

    def close(self) -> None:
        if self._proc is None:
            return
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.close()
        except BrokenPipeError:
            pass
        # Every job was answered (committed) before tag() returned: nothing is left to wait for, and
        # a child still importing mlflow (nothing to archive) need not finish.
        self._proc.terminate()
        self._proc.wait()
        self._proc = None

    def __enter__(self) -> MlflowTagger:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _serve(uris: list[str], answers: Any) -> None:
    clients = {uri: client_for(uri) for uri in uris}
    for client in clients.values():
        client.search_experiments(max_results=1)  # opens the store (schema check) before any job comes
    for line in sys.stdin:
        job = json.loads(line)
        try:
            client = clients.get(job["uri"]) or client_for(job["uri"])
            tag_run(client, job["run_id"], job["tags"], Path(job["artifact"]))
            answers.write(json.dumps({"ok": True}) + "\n")
        except Exception as exc:  # reported to the parent, which fails the push with it
            answers.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        answers.flush()


if __name__ == "__main__":
    # The answers go to the real stdout; anything else printed here (library chatter) to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _serve(sys.argv[1:], answers)
