"""The MLflow tagging child of `distill archive push`: tags land on the real sqlite store, and a
failure comes back to the parent as an error naming the run, never as a silent success."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.archive.dvcrepo import ArchiveError
from distill.archive.tagger import MlflowTagger


def test_tags_and_artifact_land_and_failures_name_the_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    run_id = client.create_run(exp).info.run_id
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"a": 1}')
    with MlflowTagger([uri]) as tagger:
        tagger.tag(uri, run_id, {"archive.md5.checkpoints": "abc.dir"}, manifest)
        with pytest.raises(ArchiveError, match="MLflow tagging of run no-such-run .* failed"):
            tagger.tag(uri, "no-such-run", {"x": "y"}, manifest)
        # The child survives a failed job and serves the next one.
        tagger.tag(uri, run_id, {"archive.remote": "s3://b/p"}, manifest)
    run = client.get_run(run_id)
    assert run.data.tags["archive.md5.checkpoints"] == "abc.dir"
    assert run.data.tags["archive.remote"] == "s3://b/p"
    assert [a.path for a in client.list_artifacts(run_id)] == ["manifest.json"]


def test_a_store_it_was_not_started_for_gets_its_own_child(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'other.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("t", (tmp_path / "a").as_uri())).info.run_id
    (tmp_path / "m.json").write_text("{}")
    with MlflowTagger([]) as tagger:  # e.g. nothing to warm up at start
        tagger.tag(uri, run_id, {"k": "v"}, tmp_path / "m.json")
    assert client.get_run(run_id).data.tags["k"] == "v"
