"""benchmarks/diagnose_precision.py's core on fake runs: diagnose a set of run directories, tally
the findings by rule over healthy and planted runs, and write the table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from .fake_runs import HEALTHY_CONFIG, healthy_metrics, series_rows, write_run

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "diagnose_precision.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diagnose_precision_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_tally_counts_false_alarms_catches_and_unmeasured(tmp_path: Path) -> None:
    bench = _bench()
    healthy_ws, faults_ws = tmp_path / "grid", tmp_path / "faults"
    for seed in (0, 1):
        write_run(healthy_ws, f"g1-rlve-opd-s{seed}", config=HEALTHY_CONFIG, metrics=healthy_metrics())
    # One "healthy" run with a truncating rollout budget: a false alarm the table must count.
    noisy = healthy_metrics()
    for row in noisy:
        if "train/loss" in row:
            row["student/truncation_rate"] = 0.6
    write_run(healthy_ws, "g1-rlve-rose-s0", config=HEALTHY_CONFIG, metrics=noisy)
    write_run(healthy_ws, "other-run", config=HEALTHY_CONFIG, metrics=healthy_metrics())
    plants = [
        bench.Plant("control-opd", (), (), "control", control=True),
        bench.Plant("budget", (), ("teacher_truncation",), "t=4"),
        bench.Plant("clamp", (), ("clamp_saturated",), "clip", needs="kl/clip_share"),
        bench.Plant("thinking", (), ("thinking_mismatch",), "think"),
        bench.Plant("served", (), ("teacher_reference_gap",), "gap", manual="needs a served teacher"),
        bench.Plant("live", (), ("precision",), "bf16"),
    ]
    write_run(faults_ws, "plant-live", summary={"status": "RUNNING"}, metrics=healthy_metrics())
    write_run(faults_ws, "plant-control-opd", config=HEALTHY_CONFIG, metrics=healthy_metrics())
    write_run(
        faults_ws,
        "plant-budget",
        method={"name": "rose", "teacher_max_tokens": 4},
        metrics=series_rows(
            10, teacher__truncation_rate=lambda s: 1.0, teacher__ce_target_share=lambda s: 1.0
        ),
    )
    # The clamp plant ran before the metric was logged: not measured, not a miss.
    write_run(faults_ws, "plant-clamp", config={"method.advantage_clip": 0.001}, metrics=healthy_metrics())
    # The thinking plant planted nothing the rule sees: a miss.
    write_run(faults_ws, "plant-thinking", config=HEALTHY_CONFIG, metrics=healthy_metrics())

    healthy = [bench.diagnose_dir(d) for d in bench.run_dirs(healthy_ws, "g1-")]
    assert [o.run for o in healthy] == ["g1-rlve-opd-s0", "g1-rlve-opd-s1", "g1-rlve-rose-s0"]
    planted = {
        p.name: bench.diagnose_dir(faults_ws / "runs" / f"plant-{p.name}") for p in plants if not p.manual
    }
    planted["served"] = None
    rows = {r.rule: r for r in bench.tally(healthy, planted, plants)}

    assert (rows["student_truncation"].healthy_fired, rows["student_truncation"].healthy_total) == (1, 3)
    assert rows["student_truncation"].healthy_runs == ["g1-rlve-rose-s0"]
    assert rows["teacher_truncation"].caught == ["error"] and rows["teacher_truncation"].verdict() == "caught"
    assert rows["clamp_saturated"].caught == ["not measured: the run logs no kl/clip_share"]
    assert rows["clamp_saturated"].verdict() == "not measured"
    assert rows["thinking_mismatch"].caught == ["missed"] and rows["thinking_mismatch"].verdict() == "MISSED"
    assert rows["teacher_truncation"].healthy_fired == 0
    # A plant this script cannot make, and one still running: neither caught nor missed.
    assert rows["teacher_reference_gap"].caught == ["not measured: needs a served teacher"]
    assert rows["precision"].caught == ["not measured: the run is RUNNING"]

    table = bench.to_markdown(list(rows.values()), healthy, planted)
    assert "| `student_truncation` | 1 / 3 (g1-rlve-rose-s0) | - | - |" in table
    assert "Healthy runs with any warning or error: 1 of 3." in table


def test_main_writes_the_table_and_exits_on_misses(tmp_path: Path) -> None:
    bench = _bench()
    healthy_ws, faults_ws = tmp_path / "grid", tmp_path / "faults"
    write_run(healthy_ws, "g-rlve-opd-s0", config=HEALTHY_CONFIG, metrics=healthy_metrics())
    write_run(
        faults_ws,
        "plant-teacher-budget",
        method={"name": "rose", "teacher_max_tokens": 4},
        metrics=series_rows(10, teacher__truncation_rate=lambda s: 1.0),
    )
    code = bench.main(["--healthy", str(healthy_ws), "--faults", str(faults_ws), "--only", "teacher-budget"])
    assert code == 0
    data = json.loads((faults_ws / "diagnose-precision.json").read_text())
    [row] = [r for r in data["rows"] if r["rule"] == "teacher_truncation"]
    assert row["caught"] == ["error"] and row["healthy_fired"] == 0
    assert "`teacher_truncation`" in (faults_ws / "diagnose-precision.md").read_text()


def test_a_plants_own_settings_follow_the_short_ones_so_it_may_override_them(tmp_path: Path) -> None:
    """The teacher-weaker plant turns the teacher's step-0 eval back on (the short settings turn
    it off): the last of two settings of one key wins on `distill run`'s command line."""
    bench = _bench()
    plant = next(p for p in bench.PLANTS if p.name == "teacher-weaker")
    cmd = bench.plant_command(plant, tmp_path)
    run = cmd.index("run")
    assert cmd[run + 1 : run + 5] == ["--domain", "rlve", "--method", "opd"]
    assert cmd.index("eval.eval_teacher=true") > cmd.index("eval.eval_teacher=false")
