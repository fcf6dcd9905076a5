"""Diagnose's precision: how often each rule fires on healthy runs, and whether it catches the
fault planted for it.

Healthy runs are the presets at their budgets: a `distill grid` over every domain and method with
two seeds, read from its workspace (read only: diagnose runs in this process, nothing is written
there). Planted runs are real `distill run`s with short settings, one fault each, made by this
script in its own workspace (`--make`), so the table can be made again:

    DISTILL_ZOO_DIR=/work/zoo python benchmarks/diagnose_precision.py \\
        --healthy /work/ws-grid --faults /work/ws-diag --make

The table (printed, and written as Markdown and JSON next to the planted runs, or to --out): per
rule, the healthy runs it fired on at warning or error (goal 0), and the planted faults it was
expected to catch with what it said (goal: every one). A planted fault whose catch depends on a
metric the run did not log is "not measured", never counted as caught or missed. Short control
runs (the plants' settings, no fault) are diagnosed beside them: a rule that fires on its control
would be catching the short settings, not the fault.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Every planted run: the preset of its domain and method, 30 steps, 50 eval items.
SHORT = ("optim.max_steps=30", "eval.items=50", "checkpoint.every_steps=0", "eval.eval_teacher=false")


@dataclass(frozen=True)
class Plant:
    """One planted fault: the `distill run` arguments that plant it and the findings that catch it."""

    name: str
    args: tuple[str, ...]
    expect: tuple[str, ...]  # finding names (before any `:bench`); any one of them is the catch
    how: str
    needs: str = ""  # a metric the catch depends on; without it the plant is not measured
    prepare: str = ""  # a model this script builds first (see PREPARE)
    control: bool = False  # no fault: the plants' settings alone (expects nothing at warning+)
    manual: str = ""  # why this script cannot make the run (then it is "not measured")


OPD = ("--domain", "rlve", "--method", "opd")
ROSE = ("--domain", "rlve", "--method", "rose")
SFT = ("--domain", "rlve", "--method", "sft")
OTHER_TEMPLATE = "teacher-other-template"

PLANTS: tuple[Plant, ...] = (
    Plant("control-opd", OPD, (), "the OPD preset at the short settings", control=True),
    Plant("control-rose", ROSE, (), "the ROSE preset at the short settings", control=True),
    Plant("control-sft", SFT, (), "the SFT preset at the short settings", control=True),
    Plant(
        "teacher-budget",
        (*ROSE, "method.teacher_max_tokens=4"),
        ("teacher_truncation",),
        "ROSE's teacher continues at most 4 tokens",
    ),
    Plant(
        "bf16-tiny-lr",
        (*OPD, "student.precision=bf16", "optim.lr=1e-7"),
        ("precision",),
        "bf16 student weights at lr 1e-7",
    ),
    Plant(
        "lr-collapse",
        (*SFT, "optim.lr=0.05"),
        ("eval_regression",),
        "SFT at lr 0.05 (the preset: 3e-4)",
    ),
    Plant(
        "thinking-mismatch",
        (*OPD, "student.enable_thinking=true", "teacher.enable_thinking=false", "preflight=false"),
        ("thinking_mismatch",),
        "the teacher's prompt opens with an empty think block, the student's not; preflight off",
    ),
    Plant(
        "template-mismatch",
        (*OPD, f"teacher.name={{faults}}/{OTHER_TEMPLATE}", "preflight=false"),
        ("template_mismatch",),
        "the zoo teacher's weights in a folder whose chat template writes `[role]` headers; preflight off",
        prepare="other_template",
    ),
    Plant(
        "template-refused",
        (*OPD, f"teacher.name={{faults}}/{OTHER_TEMPLATE}"),
        ("template_mismatch",),
        "the same teacher, preflight on: the run is refused before training",
        prepare="other_template",
    ),
    Plant(
        "teacher-is-student",
        (*OPD, "teacher.name=zoo:student"),
        ("teacher_is_student",),
        "teacher.name=zoo:student",
    ),
    Plant(
        "async-bottleneck",
        (*OPD, "teacher.precision=fp16"),
        ("teacher_bottleneck",),
        "the async teacher's worker in fp16 on a CPU (its matmuls 12x slower than fp32 here), the student in fp32",
    ),
    Plant(
        "eval-regression",
        (*SFT, "method.temperature=3.0", "method.keep_verified_only=false"),
        ("eval_regression",),
        "SFT on the teacher's trajectories sampled at temperature 3, unverified: noise as targets",
    ),
    Plant(
        "rollout-truncation",
        (*OPD, "rollout.max_new_tokens=8"),
        ("student_truncation",),
        "rollouts cut at 8 tokens (answers take ~35)",
    ),
    Plant(
        "seam-failures",
        (*OPD, "teacher.name=zoo:teacher-llama", "rollout.temperature=3.0"),
        ("seam_failures",),
        "cross-family OPD (the llama-tokenizer teacher) sampling at temperature 3",
    ),
    Plant(
        "topk-collapse",
        (*OPD, "method.top_k=4", "optim.lr=0.1", "optim.scheduler=constant"),
        ("topk_mass_collapse",),
        "forward KL over the teacher's top-4 at lr 0.1: the diverging student's mass leaves the "
        "teacher's tokens (distill has no top-k reverse KL, verl's cause)",
        needs="kl/student_topk_mass",
    ),
    Plant(
        "clamp-saturated",
        (*OPD, "method.loss=token_reward_direct", "method.advantage_clip=0.001"),
        ("clamp_saturated",),
        "token_reward_direct with the advantage clamped at 0.001",
        needs="kl/clip_share",
    ),
    Plant(
        "teacher-weaker",
        (*OPD, "student.name=zoo:teacher", "teacher.name=zoo:student", "eval.eval_teacher=true"),
        ("teacher_weaker",),
        "the zoo teacher as the student and the zoo student as its teacher: a teacher far below its "
        "student before training (the teacher evaluated at step 0)",
        needs="teacher/eval/rlve/accuracy",
    ),
    Plant(
        "duplicate-rollouts",
        (*OPD, "rollout.temperature=0.01", "rollout.num_generations=4"),
        ("duplicate_rollouts",),
        "near-greedy sampling (temperature 0.01) with 4 samples a prompt",
        needs="student/duplicate_share",
    ),
    Plant(
        "reference-gap",
        (*OPD, "teacher.engine=server", "teacher.url=http://127.0.0.1:8000"),
        ("teacher_reference_gap",),
        "a served teacher whose server holds another checkpoint than teacher.name",
        manual="needs a served teacher (`distill serve teacher`, vLLM: a GPU machine) started on another "
        "checkpoint; not plantable by config on a CPU",
    ),
    Plant(
        "out-of-vocab",
        (*OPD, "student.name={faults}/padded-student"),
        ("out_of_vocab",),
        "the zoo student with 16 head rows beyond its tokenizer, each a copy of `<|im_end|>`'s",
        needs="student/out_of_vocab_rate",
        prepare="padded_student",
    ),
)


@dataclass
class RunOutcome:
    """What diagnose said about one run: the highest severity per finding name."""

    run: str
    status: str
    fired: dict[str, str] = field(default_factory=dict)  # finding name -> "warning" / "error" / "info"
    logged: list[str] = field(default_factory=list)  # metric keys the run logged
    error: str = ""  # why the run could not be diagnosed

    def alarms(self) -> dict[str, str]:
        return {k: v for k, v in self.fired.items() if v in ("warning", "error")}


def rule_of(finding: str) -> str:
    """A finding's rule name: `eval_regression:rlve` -> `eval_regression`."""
    return finding.split(":", 1)[0]


def diagnose_dir(run_dir: Path) -> RunOutcome:
    """Diagnose one run directory in this process (nothing is written into it)."""
    from distill.diagnose import diagnose, load_run

    try:
        rec = load_run(run_dir)
        findings = diagnose(rec)
    except Exception as exc:  # one unreadable run must not hide the rest of the table
        return RunOutcome(run_dir.name, "?", error=f"{type(exc).__name__}: {exc}")
    order = {"info": 0, "warning": 1, "error": 2}
    fired: dict[str, str] = {}
    for f in findings:
        name, sev = rule_of(f.name), f.severity.label
        if order[sev] >= order.get(fired.get(name, "info"), 0):
            fired[name] = sev
    return RunOutcome(run_dir.name, str(rec.summary.get("status", "?")), fired, sorted(rec.series))


def run_dirs(workspace: Path, prefix: str = "") -> list[Path]:
    runs = workspace / "runs"
    if not runs.is_dir():
        return []
    return sorted(p for p in runs.iterdir() if (p / "config.yaml").exists() and p.name.startswith(prefix))


@dataclass
class Row:
    rule: str
    healthy_fired: int
    healthy_total: int
    healthy_runs: list[str]
    control_fired: list[str]
    plants: list[str]
    caught: list[str]  # per plant: "error", "warning", "info", "missed" or "not measured: ..."

    def verdict(self) -> str:
        marks = [c for c in self.caught if not c.startswith("not measured")]
        if not self.plants:
            return "-"
        if not marks:
            return "not measured"
        return "caught" if all(c in ("warning", "error") for c in marks) else "MISSED"


def plant_result(plant: Plant, outcome: RunOutcome | None) -> str:
    """How the planted run came out for this plant's expected findings."""
    if outcome is None:
        return f"not measured: {plant.manual or 'no run'}"
    if outcome.error:
        return f"not measured: {outcome.error}"
    if outcome.status not in ("FINISHED", "FAILED"):
        return f"not measured: the run is {outcome.status}"
    got = [outcome.fired[name] for name in plant.expect if name in outcome.fired]
    if "error" in got:
        return "error"
    if "warning" in got:
        return "warning"
    if plant.needs and plant.needs not in outcome.logged:
        return f"not measured: the run logs no {plant.needs}"
    return "info" if got else "missed"


def tally(
    healthy: list[RunOutcome], planted: dict[str, RunOutcome | None], plants: Iterable[Plant] = PLANTS
) -> list[Row]:
    """One row per rule that fired on any run or is expected by a plant."""
    plants = list(plants)
    names = {n for o in healthy for n in o.fired} | {n for p in plants for n in p.expect}
    names |= {n for o in planted.values() if o is not None for n in o.fired}
    rows = []
    for name in sorted(names):
        fired = [o.run for o in healthy if name in o.alarms()]
        controls = [p.name for p in plants if p.control and name in (_alarms(planted.get(p.name)))]
        mine = [p for p in plants if name in p.expect]
        rows.append(
            Row(
                rule=name,
                healthy_fired=len(fired),
                healthy_total=len(healthy),
                healthy_runs=fired,
                control_fired=controls,
                plants=[p.name for p in mine],
                caught=[plant_result(p, planted.get(p.name)) for p in mine],
            )
        )
    return rows


def _alarms(outcome: RunOutcome | None) -> dict[str, str]:
    return outcome.alarms() if outcome is not None else {}


def to_markdown(rows: list[Row], healthy: list[RunOutcome], planted: dict[str, RunOutcome | None]) -> str:
    lines = [
        "| rule | fired on healthy runs | planted fault | caught |",
        "|---|---|---|---|",
    ]
    for r in rows:
        fired = f"{r.healthy_fired} / {r.healthy_total}"
        if r.healthy_runs:
            fired += " (" + ", ".join(r.healthy_runs[:4]) + ("…" if len(r.healthy_runs) > 4 else "") + ")"
        if r.control_fired:
            fired += f"; short controls: {', '.join(r.control_fired)}"
        plants = ", ".join(r.plants) or "-"
        caught = ", ".join(f"{c}" for c in r.caught) or "-"
        lines.append(f"| `{r.rule}` | {fired} | {plants} | {caught} |")
    alarms = sum(1 for o in healthy if o.alarms())
    lines += ["", f"Healthy runs with any warning or error: {alarms} of {len(healthy)}."]
    return "\n".join(lines) + "\n"


def plants_markdown(plants: Iterable[Plant]) -> str:
    """One table row per plant: its name, how it is planted, its overrides and what catches it."""
    lines = []
    for p in plants:
        args = " ".join(
            a for a in p.args if not a.startswith("--") and a not in ("rlve", "opd", "rose", "sft")
        )
        method = p.args[3] if len(p.args) > 3 else "?"
        expect = ", ".join(f"`{e}`" for e in p.expect) or "nothing at warning or above"
        lines.append(f"| `{p.name}` ({method}) | {p.how}: `{args or '(the preset)'}` | {expect} |")
    return "\n".join(lines) + "\n"


def print_summary(rows: list[Row]) -> None:
    width = max([len(r.rule) for r in rows] + [4])
    print(f"{'rule':<{width}}  healthy  planted -> caught")
    for r in rows:
        plants = ", ".join(f"{p}: {c}" for p, c in zip(r.plants, r.caught, strict=True)) or "-"
        ctrl = f"  [controls: {', '.join(r.control_fired)}]" if r.control_fired else ""
        print(f"{r.rule:<{width}}  {r.healthy_fired:>3}/{r.healthy_total:<3}  {plants}{ctrl}")


# -- making the planted runs -----------------------------------------------------------------


def _env(faults: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DISTILL_WORKSPACE": str(faults),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
    }


def _zoo_model(name: str) -> Path:
    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    return Path(resolve_model(name, domain_config("rlve"), get_settings(), show_progress=False))


def prepare_other_template(faults: Path) -> None:
    """The zoo teacher's files with a chat template that writes `[role]` instead of
    `<|im_start|>role`: a real second template, whatever `teacher.chat_template` is wired to."""
    import shutil

    out = faults / OTHER_TEMPLATE
    if not (out / "config.json").exists():
        shutil.copytree(_zoo_model("zoo:teacher"), out, dirs_exist_ok=True)
    (out / "chat_template.jinja").write_text(
        "{%- for m in messages -%}{{ '[' + m['role'] + ']\\n' + m['content'] + '\\n' }}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '[assistant]\\n' }}{%- endif -%}"
    )


def prepare_padded_student(faults: Path) -> None:
    """The zoo student with 16 output rows past its tokenizer, each a copy of the end-of-turn
    row: wherever the student would end its turn, a padded id is as likely as the real one."""
    out = faults / "padded-student"
    if (out / "config.json").exists():
        return
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _zoo_model("zoo:student")
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rows = model.get_output_embeddings().weight.shape[0]
    model.resize_token_embeddings(rows + 16)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[rows:] = head[end]
    model.save_pretrained(out)
    tok.save_pretrained(out)


PREPARE = {"other_template": prepare_other_template, "padded_student": prepare_padded_student}


def plant_command(plant: Plant, faults: Path) -> list[str]:
    args = [a.replace("{faults}", str(faults)) for a in plant.args]
    return [
        "nice",
        "-n",
        "5",
        sys.executable,
        "-m",
        "distill",
        "run",
        # Domain and method, the short settings, then the plant's own: a plant may override one.
        *args[:4],
        *SHORT,
        *args[4:],
        f"tracking.run_name=plant-{plant.name}",
    ]


def make_plants(plants: list[Plant], faults: Path, remake: bool) -> None:
    """Run each plant's `distill run` that is not there yet (all of them with `remake`)."""
    faults.mkdir(parents=True, exist_ok=True)
    for plant in plants:
        run_dir = faults / "runs" / f"plant-{plant.name}"
        if plant.manual or (run_dir.exists() and not remake):
            continue
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        if plant.prepare:
            PREPARE[plant.prepare](faults)
        cmd = plant_command(plant, faults)
        print(f"[{plant.name}] {' '.join(cmd[3:])}", flush=True)
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=_env(faults), capture_output=True, text=True)
        said = [
            ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith(("student ", "diagnose "))
        ]
        said = said or (proc.stderr.strip().splitlines() or [""])[-1:]
        took = time.perf_counter() - start
        print(f"[{plant.name}] exit {proc.returncode} in {took:.0f} s; " + "; ".join(said)[:300], flush=True)
        (faults / "logs").mkdir(exist_ok=True)
        (faults / "logs" / f"{plant.name}.log").write_text(proc.stdout + proc.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--healthy", type=Path, action="append", default=[], help="workspace of healthy runs")
    ap.add_argument("--grid", default="", help="only the healthy runs of this grid id (a name prefix)")
    ap.add_argument("--faults", type=Path, required=True, help="workspace of the planted runs")
    ap.add_argument("--make", action="store_true", help="make the planted runs that are missing")
    ap.add_argument("--remake", action="store_true", help="make every planted run again")
    ap.add_argument("--only", default="", help="comma-separated plant names")
    ap.add_argument("--out", type=Path, help="where the table goes (default: <faults>/diagnose-precision.md)")
    ap.add_argument("--list", action="store_true", help="print the plants as Markdown rows and exit")
    args = ap.parse_args(argv)
    plants = [p for p in PLANTS if not args.only or p.name in args.only.split(",")]
    if args.list:
        print(plants_markdown(plants), end="")
        return 0
    if args.make or args.remake:
        make_plants(plants, args.faults, args.remake)
    seen = [diagnose_dir(d) for ws in args.healthy for d in run_dirs(ws, args.grid)]
    # A healthy preset run is a finished one: a run still going (or stopped) has no final eval.
    healthy = [o for o in seen if o.status == "FINISHED"]
    unfinished = [o.run for o in seen if o.status != "FINISHED"]
    planted: dict[str, RunOutcome | None] = {}
    for p in plants:
        d = args.faults / "runs" / f"plant-{p.name}"
        planted[p.name] = diagnose_dir(d) if d.exists() else None
    rows = tally(healthy, planted, plants)
    print_summary(rows)
    out = args.out or args.faults / "diagnose-precision.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    table = to_markdown(rows, healthy, planted)
    if unfinished:
        table += f"Not counted (not finished): {', '.join(unfinished)}.\n"
    out.write_text(table)
    payload: dict[str, Any] = {
        "rows": [asdict(r) for r in rows],
        "healthy": [asdict(o) | {"logged": len(o.logged)} for o in healthy],
        "unfinished": unfinished,
        "planted": {k: (asdict(v) | {"logged": len(v.logged)}) if v else None for k, v in planted.items()},
        "plants": [asdict(p) for p in plants],
    }
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    print(f"table: {out}")
    false_alarms = sum(r.healthy_fired for r in rows)
    missed = sum(r.verdict() == "MISSED" for r in rows)
    return 1 if false_alarms or missed else 0


if __name__ == "__main__":
    sys.exit(main())
