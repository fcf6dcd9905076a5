"""Reports (text, Markdown, JSON), the files under <run>/diagnose/, plots, and the MLflow upload."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from distill.diagnose import load_run
from distill.diagnose.plots import plot_run
from distill.diagnose.report import build_report, log_to_mlflow, print_report, to_json, to_markdown

from .conftest import MakeRun
from .fake_runs import HEALTHY_CONFIG, eval_rows, healthy_metrics, series_rows

PNG = b"\x89PNG\r\n\x1a\n"


def _sick_metrics() -> list[dict]:
    rows = series_rows(
        12,
        train__ce_loss=lambda s: 1.0 - 0.01 * s,
        train__grad_norm=lambda s: 1.0,
        teacher__truncation_rate=lambda s: 1.0,
        teacher__ce_target_share=lambda s: 0.97,
        teacher__ce_target_tokens_max=lambda s: 1016.0,
        coverage__supervised_share=lambda s: 0.06,
        student__truncation_rate=lambda s: 0.1 + 0.02 * s,
        student__completion_tokens_mean=lambda s: 17000.0,
        kl__reverse_kl_mean=lambda s: 0.3,
    )
    return [
        eval_rows("dapo", 0, {"avg@16": 0.6, "pass@16": 0.8, "truncation_rate": 0.1}),
        *rows,
        eval_rows("dapo", 12, {"avg@16": 0.55, "pass@16": 0.83, "truncation_rate": 0.3}),
    ]


def test_build_report_writes_files_and_plots(make_run: MakeRun) -> None:
    run = make_run(
        "sick",
        method={"name": "rose", "prefix_tokens": 1024, "teacher_max_tokens": 1024},
        config={"domain.name": "dapo"},
        metrics=_sick_metrics(),
    )
    report = build_report(load_run("sick"))
    assert report.exit_code == 2
    names = [f.name for f in report.findings]
    assert names[:2] == ["teacher_truncation", "supervision_coverage"]  # errors first, in rule order
    assert {"student_truncation", "eval_truncation:dapo", "eval_divergence:dapo"} <= set(names)
    folder = run / "diagnose"
    assert {p.name for p in report.plots} == {
        "loss.png",
        "kl.png",
        "truncation.png",
        "budget.png",
        "eval.png",
    }
    for p in report.plots:
        assert p.parent == folder and p.read_bytes()[:8] == PNG
    data = json.loads((folder / "report.json").read_text())
    assert data["exit_code"] == 2 and data["counts"]["error"] == 2 and data["method"] == "rose"
    first = data["findings"][0]
    assert first["severity"] == "error" and first["fixes"][0]["override"] == "method.teacher_max_tokens=2048"
    md = (folder / "report.md").read_text()
    assert md.startswith("# diagnose: sick") and "## ERROR: teacher continuations cut" in md
    assert "- `method.teacher_max_tokens=2048`" in md and "![loss](loss.png)" in md


def test_text_and_json_rendering(make_run: MakeRun) -> None:
    make_run(
        "sick",
        method={"name": "rose", "prefix_tokens": 1024, "teacher_max_tokens": 1024},
        metrics=_sick_metrics(),
    )
    report = build_report(load_run("sick"), plots=False)
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=160))
    text = buf.getvalue()
    assert "ERROR" in text and "teacher/truncation_rate = 1 (steps 1-12)" in text
    assert "method.teacher_max_tokens=2048" in text and "why" in text
    assert all(line == line.rstrip() for line in text.splitlines())  # no pad spaces in logs
    both = json.loads(to_json([report, report]))
    assert both["exit_code"] == 2 and len(both["runs"]) == 2
    assert to_markdown(report).count("## ERROR") == 2


def test_plots_only_for_logged_keys_and_10k_points_thinned(make_run: MakeRun) -> None:
    run = make_run("long", metrics=series_rows(10_000, train__loss=lambda s: 1.0 / s))
    written = plot_run(load_run("long"), run / "out")
    assert [p.name for p in written] == ["loss.png"]


def test_healthy_report_exit_zero(make_run: MakeRun) -> None:
    make_run("good", config=HEALTHY_CONFIG, metrics=healthy_metrics())
    assert build_report(load_run("good"), plots=False).exit_code == 0


def test_log_to_mlflow_adds_artifacts_without_touching_status(make_run: MakeRun, workspace: Path) -> None:
    from mlflow.tracking import MlflowClient

    from distill.tracking.mlflow import open_tracker

    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    tracker = open_tracker(uri, "distill", workspace / "mlartifacts", run_name="sick")
    tracker.finish("FINISHED")
    make_run(
        "sick",
        method={"name": "rose", "prefix_tokens": 1024, "teacher_max_tokens": 1024},
        metrics=_sick_metrics(),
        summary={"mlflow_run_id": tracker.run_id, "tracking_uri": uri},
    )
    report = build_report(load_run("sick"))
    assert log_to_mlflow(report).startswith(f"run {tracker.run_id}: artifacts diagnose/")
    client = MlflowClient(tracking_uri=uri)
    listed = {a.path for a in client.list_artifacts(tracker.run_id, "diagnose")}
    assert {"diagnose/report.json", "diagnose/report.md", "diagnose/loss.png"} <= listed
    assert client.get_run(tracker.run_id).info.status == "FINISHED"
    make_run("no-mlflow", metrics=_sick_metrics())
    assert log_to_mlflow(build_report(load_run("no-mlflow"), plots=False)).startswith("not logged")
