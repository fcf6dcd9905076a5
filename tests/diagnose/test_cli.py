"""`distill diagnose`, `distill compare` and the `distill runs` filters through the typer app."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distill.cli.app import app

from .conftest import MakeRun
from .fake_runs import HEALTHY_CONFIG, eval_rows, healthy_metrics

runner = CliRunner()


def _warning_only_metrics() -> list[dict]:
    rows = healthy_metrics()
    for row in rows:
        if "student/truncation_rate" in row:
            row["student/truncation_rate"] = 0.02 + 0.003 * row["step"]  # 0.02 -> 0.17: rising, not high
    return rows


@pytest.fixture
def three_runs(make_run: MakeRun) -> dict[str, Path]:
    return {
        "good": make_run("good", config=HEALTHY_CONFIG, metrics=healthy_metrics()),
        "meh": make_run("meh", config=HEALTHY_CONFIG, metrics=_warning_only_metrics()),
        "bad": make_run(
            "bad", config={**HEALTHY_CONFIG, "student.enable_thinking": True}, metrics=healthy_metrics()
        ),
    }


def test_exit_codes_follow_the_worst_finding(three_runs: dict[str, Path]) -> None:
    for name, code in (("good", 0), ("meh", 1), ("bad", 2)):
        result = runner.invoke(app, ["diagnose", name, "--no-plots", "--no-mlflow"])
        assert result.exit_code == code, (name, result.output)
    both = runner.invoke(app, ["diagnose", "good", "meh", "--no-plots", "--no-mlflow"])
    assert both.exit_code == 1 and "diagnose good" in both.stdout and "diagnose meh" in both.stdout
    assert "truncation rising in student rollouts" in both.stdout


def test_json_and_markdown_formats(three_runs: dict[str, Path]) -> None:
    result = runner.invoke(app, ["diagnose", "bad", "--format", "json", "--no-mlflow"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    [run] = data["runs"]
    assert data["exit_code"] == 2 and run["findings"][0]["name"] == "thinking_mismatch"
    assert {Path(p).name for p in run["plots"]} >= {"loss.png", "eval.png"}
    md = runner.invoke(
        app, ["diagnose", str(three_runs["bad"]), "--format", "markdown", "--no-plots", "--no-mlflow"]
    )
    assert md.stdout.startswith("# diagnose: bad") and "`teacher.enable_thinking=true`" in md.stdout
    bad_fmt = runner.invoke(app, ["diagnose", "bad", "--format", "yaml"])
    assert bad_fmt.exit_code == 2 and "unknown format" in bad_fmt.stderr


def test_missing_run_is_one_error_line_exit_2(three_runs: dict[str, Path]) -> None:
    result = runner.invoke(app, ["diagnose", "good", "nope"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: no run 'nope'") and result.stderr.count("\n") == 1
    assert not (three_runs["good"] / "diagnose").exists()  # refs are checked before any work
    broken = three_runs["meh"] / "config.yaml"
    broken.write_text("method: [unclosed")
    result = runner.invoke(app, ["diagnose", "meh"])
    assert result.exit_code == 2 and result.stderr.startswith("error: run meh:")


def test_compare_formats_baseline_and_plot(make_run: MakeRun, workspace: Path) -> None:
    for name, avg in (("a", 0.2), ("b", 0.3)):
        after = {"avg@4": avg, "pass@4": avg + 0.2, "pass@1": avg, "solved": avg * 100}
        make_run(
            name,
            summary={"student_after": after, "steps": 10},
            metrics=[eval_rows("rlve", 0, {"avg@4": 0.1}), eval_rows("rlve", 10, after)],
        )
    table = runner.invoke(app, ["compare", "a", "b"])
    assert table.exit_code == 0, table.output
    assert "avg@4" in table.stdout and "(+0.1000)" in table.stdout
    plots = list((workspace / "compare").glob("compare-*.png"))
    assert len(plots) == 1 and f"plot  {plots[0]}" in table.stdout
    out = runner.invoke(app, ["compare", "a", "b", "--baseline", "b", "--format", "csv", "--no-plot"])
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["baseline"] for r in rows] == ["False", "True"] and float(
        rows[0]["avg@4_delta"]
    ) == pytest.approx(-0.1)
    data = json.loads(
        runner.invoke(
            app, ["compare", "a", "--baseline", "b", "--format", "json", "--plot", str(workspace / "x.png")]
        ).stdout
    )
    assert [r["run_id"] for r in data["rows"]] == ["b", "a"] and data["plot"] == str(workspace / "x.png")
    md = runner.invoke(app, ["compare", "a", "b", "--format", "markdown", "--no-plot"]).stdout
    assert md.startswith("| run | domain |")
    missing = runner.invoke(app, ["compare", "a", "zzz"])
    assert missing.exit_code == 2 and missing.stderr.startswith("error: no run 'zzz'")


def test_runs_filters_and_sorts(make_run: MakeRun) -> None:
    specs = [
        ("r1", "opd", "FINISHED", 0.3, "2026-01-01"),
        ("r2", "sft", "FINISHED", 0.5, "2026-01-02"),
        ("r3", "opd", "FAILED", None, "2026-01-03"),
        ("r4", "opd", "FINISHED", 0.7, "2026-01-04"),
    ]
    for name, method, status, acc, day in specs:
        summary = {"status": status, "started": f"{day}T00:00:00+00:00"}
        if acc is not None:
            summary["student_after"] = {"accuracy": acc}
        make_run(name, config={"method.name": method}, summary=summary)

    def ids(*args: str) -> list[str]:
        result = runner.invoke(app, ["runs", "--json", *args])
        assert result.exit_code == 0, result.output
        return [s["run_id"] for s in json.loads(result.stdout)]

    assert ids() == ["r1", "r2", "r3", "r4"]
    assert ids("--method", "opd") == ["r1", "r3", "r4"]
    assert ids("--method", "opd", "--status", "finished") == ["r1", "r4"]
    assert ids("--sort", "accuracy") == ["r4", "r2", "r1", "r3"]
    assert ids("--sort", "method") == ["r1", "r3", "r4", "r2"]
    assert ids("--domain", "sciworld") == []
    table = runner.invoke(app, ["runs", "--domain", "sciworld"])
    assert "no runs match the filters (4 runs in all)" in table.stdout
    bad = runner.invoke(app, ["runs", "--sort", "vibes"])
    assert bad.exit_code == 2 and "unknown --sort" in bad.stderr


def test_a_crashing_rule_is_a_warning_and_the_diagnosis_incomplete(
    three_runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import distill.diagnose as diagnosis

    rules = diagnosis.all_rules()

    def fragile(rec):  # a rule meeting a record it does not handle
        return [rec.summary["no such key"]]

    monkeypatch.setattr(diagnosis, "all_rules", lambda: [fragile, *rules])
    result = runner.invoke(app, ["diagnose", "bad", "--format", "json", "--no-plots", "--no-mlflow"])
    assert result.exit_code == 3, result.output  # incomplete, above the run's own error
    [run] = json.loads(result.stdout)["runs"]
    assert run["exit_code"] == 3 and run["incomplete"] == ["fragile"]
    severities = {f["name"]: f["severity"] for f in run["findings"]}
    assert severities["rule_crashed:fragile"] == "warning"
    assert severities["thinking_mismatch"] == "error"  # the other rules still ran
    text = runner.invoke(app, ["diagnose", "good", "--no-plots", "--no-mlflow"])
    assert text.exit_code == 3 and "incomplete: fragile crashed" in text.stdout
    assert "rule fragile crashed: KeyError" in text.stdout
