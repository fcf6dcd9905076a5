"""Multi-teacher OPD against the single-domain runs and the two domains one after the other, from
the same starting student.

One student (the mixed zoo's `zoo:student`, built from both domains' slices) is trained

- on rlve alone by rlve's teacher, and on dapo alone by dapo's teacher (each domain's OPD preset);
- on both at once, each row by its own domain's teacher (`configs/rlve+dapo/opd.yaml`: 1.2x the
  two presets' steps together);
- on one domain after the other (`rlve-then-dapo`: the rlve run's student trained on dapo by the
  dapo preset; `dapo-then-rlve` the other way round), the first domain evaluated again after the
  second: what a researcher without a mix would do;
- and the same with dapo's teacher of another family (`teacher-llama`), alone and mixed.

The teachers are the mixed zoo's `teacher@rlve`, `teacher@dapo` and `teacher-llama@dapo`: each
trained on its own domain, the first two with the student's tokenizer. Each domain's lift
(after - before, on its own eval items) of the mixed run is divided by its single-domain lift.

    python benchmarks/multi_teacher.py --seeds 0,1,2 --parallel 2 --out docs/img/multi_teacher
    python benchmarks/multi_teacher.py --seeds 0 --steps-scale 0.1 --eval-items 50   # a quick look
    python benchmarks/multi_teacher.py --seeds 0,1 --cases mixed --name mix-lr \\
        --set optim.lr=1.2e-3              # a variant of one case, beside the same single runs

Runs go to `--workspace` (default ./workspace); a finished run is kept and not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Case names: one domain alone (rlve, dapo), both in one run (mixed), one after the other
# (<first>-then-<second>); -llama: dapo's teacher is the cross-family one.
CASES = ("rlve", "dapo", "mixed", "dapo-llama", "mixed-llama", "rlve-then-dapo", "dapo-then-rlve")
# The first stage of a sequential case, and the domain it trains second.
SEQUENTIAL = {"rlve-then-dapo": ("rlve", "dapo"), "dapo-then-rlve": ("dapo", "rlve")}
# The eval of the first domain after the second, beside the runs: <workspace>/<EVALS>/<run>.json.
EVALS = "mt-evals"


def zoo_paths(workspace: Path) -> dict[str, str]:
    """The mixed zoo's student and teachers (built on first use)."""
    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo.build import ensure_built

    os.environ["DISTILL_WORKSPACE"] = str(workspace)
    mix = domain_config("rlve+dapo")
    root = get_settings().zoo_path
    names = ("student", "teacher@rlve", "teacher@dapo", "teacher-llama@dapo")
    return {name: str(ensure_built(root, name, mix)) for name in names}


@dataclass
class Job:
    """One `distill run` of a case and seed; `after`: the run whose final weights it starts from."""

    name: str
    case: str
    seed: int
    cmd: list[str]
    after: str | None = None
    extra: list[str] = field(default_factory=list)


def preset_steps(domain: str) -> int:
    """The steps of `domain`'s OPD preset (`configs/<domain>/opd.yaml`), which each case runs."""
    from distill.config.files import preset_path, read_yaml

    return int(read_yaml(preset_path(domain, "opd"))["optim"]["max_steps"])


def run_name(case: str, seed: int, variant: str = "") -> str:
    return f"mt-{case}{'-' + variant if variant else ''}-s{seed}"


def final_checkpoint(workspace: Path, name: str) -> Path:
    """A finished run's last `step-N` folder: its trained student."""
    steps = sorted(workspace.glob(f"runs/{name}/checkpoints/step-*"), key=lambda p: int(p.name.split("-")[1]))
    if not steps:
        raise FileNotFoundError(f"{name} has no checkpoint")
    return steps[-1]


def case_args(case: str, zoo: dict[str, str], student: str | None = None) -> list[str]:
    """A case's domain, student and teachers (`student`: the weights it starts from)."""
    start = f"student.name={student or zoo['student']}"
    if case in SEQUENTIAL:
        return case_args(SEQUENTIAL[case][1], zoo, student)
    if case == "rlve":
        return ["--domain", "rlve", start, f"teacher.name={zoo['teacher@rlve']}"]
    if case == "dapo":
        return ["--domain", "dapo", start, f"teacher.name={zoo['teacher@dapo']}"]
    if case == "dapo-llama":
        return ["--domain", "dapo", start, f"teacher.name={zoo['teacher-llama@dapo']}"]
    teachers = [f"teachers.rlve.name={zoo['teacher@rlve']}"]
    dapo = zoo["teacher-llama@dapo"] if case == "mixed-llama" else zoo["teacher@dapo"]
    return ["--domain", "rlve,dapo", start, *teachers, f"teachers.dapo.name={dapo}"]


def trained_domain(case: str) -> str:
    if case in SEQUENTIAL:
        return SEQUENTIAL[case][1]
    return "rlve+dapo" if case.startswith("mixed") else case.split("-")[0]


def make_job(case: str, seed: int, args: argparse.Namespace, zoo: dict[str, str]) -> Job:
    variant = args.name if case in args.set_cases else ""
    name = run_name(case, seed, variant)
    after = run_name(SEQUENTIAL[case][0], seed) if case in SEQUENTIAL else None
    student = (
        str(final_checkpoint(args.workspace, after)) if after and _finished(args.workspace, after) else None
    )
    steps = max(1, round(preset_steps(trained_domain(case)) * args.steps_scale))
    cmd = [sys.executable, "-m", "distill", "run", "--method", "opd", *case_args(case, zoo, student)]
    cmd += [f"seed={seed}", f"optim.max_steps={steps}", f"eval.items={args.eval_items}"]
    cmd += [f"tracking.run_name={name}", "rollout.async_teacher=false"]
    if variant:
        cmd += args.set
    return Job(name, case, seed, cmd, after)


def _summary(workspace: Path, name: str) -> dict[str, Any]:
    path = workspace / "runs" / name / "summary.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _finished(workspace: Path, name: str) -> bool:
    return _summary(workspace, name).get("status") == "FINISHED"


def first_domain_eval(workspace: Path, job: Job, eval_items: int) -> subprocess.Popen[bytes] | None:
    """Evaluate a sequential case's first domain on its final weights (as the run evaluates:
    `distill eval`'s defaults are the run's eval settings), in its own process."""
    out = workspace / EVALS / f"{job.name}.json"
    if out.exists():
        return None
    out.parent.mkdir(exist_ok=True)
    code = (
        "import json, sys; from distill.evals.standalone import EvalRequest, evaluate_model; "
        "from distill.settings import get_settings; "
        f"o = evaluate_model(EvalRequest(model=sys.argv[1], domain={SEQUENTIAL[job.case][0]!r}, "
        f"items={eval_items}), sys.argv[1], get_settings(), say=lambda s: None); "
        "open(sys.argv[2], 'w').write(json.dumps(o.result.metrics))"
    )
    ckpt = final_checkpoint(workspace, job.name)
    env = {**os.environ, "DISTILL_WORKSPACE": str(workspace)}
    log = (workspace / f"{job.name}-eval.log").open("w")
    return subprocess.Popen(
        [sys.executable, "-c", code, str(ckpt), str(out)], env=env, stdout=log, stderr=log
    )


def run_all(jobs: list[Job], args: argparse.Namespace, zoo: dict[str, str]) -> None:
    """Every job not finished yet, `--parallel` at a time, a sequential case once its first stage
    has finished; then each sequential case's eval of its first domain."""
    todo = [j for j in jobs if not _finished(args.workspace, j.name)]
    running: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    while todo or running:
        for name, (proc, start) in list(running.items()):
            if proc.poll() is not None:
                print(f"{name}: exit {proc.returncode} in {time.time() - start:.0f} s", flush=True)
                del running[name]
        for job in list(todo):
            if len(running) >= args.parallel:
                break
            if job.after and job.after in running:
                continue
            if job.after and not _finished(args.workspace, job.after):
                todo.remove(job)  # its first stage failed: nothing to start from
                print(f"{job.name}: skipped ({job.after} did not finish)", flush=True)
                continue
            job = make_job(job.case, job.seed, args, zoo)  # its start known now
            todo = [j for j in todo if j.name != job.name]
            log = (args.workspace / f"{job.name}.log").open("w")
            env = {**os.environ, "DISTILL_WORKSPACE": str(args.workspace)}
            proc = subprocess.Popen(job.cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            running[job.name] = (proc, time.time())
        time.sleep(2)
    for job in jobs:
        if job.case in SEQUENTIAL and _finished(args.workspace, job.name):
            proc = first_domain_eval(args.workspace, job, args.eval_items)
            if proc is not None:
                proc.wait()


def lift(summary: dict[str, Any], domain: str) -> tuple[float, float, float] | None:
    """(before, after, after - before) accuracy on `domain`'s eval items."""
    parts = summary.get("parts") or {}
    scores = parts.get(domain) or (summary if summary.get("domain") == domain else None)
    if not scores or "student_after" not in scores:
        return None
    before, after = scores["student_before"]["accuracy"], scores["student_after"]["accuracy"]
    return before, after, after - before


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def table(
    results: dict[tuple[str, int], dict[str, Any]], seeds: list[int], mixed: str = "mixed"
) -> list[str]:
    rows = [
        "| domain | teacher family | single-domain lift | mixed-run lift | mixed / single |",
        "|---|---|---|---|---|",
    ]
    for domain, single, mix, family in (
        ("rlve", "rlve", mixed, "same"),
        ("dapo", "dapo", mixed, "same"),
        ("rlve", "rlve", f"{mixed}-llama", "same (beside a cross-family dapo teacher)"),
        ("dapo", "dapo-llama", f"{mixed}-llama", "cross (llama)"),
    ):
        a = [lift(results.get((single, s), {}), domain) for s in seeds]
        b = [lift(results.get((mix, s), {}), domain) for s in seeds]
        if any(x is None for x in a + b):
            rows.append(f"| {domain} | {family} | missing | missing | - |")
            continue
        la = [x[2] for x in a if x]
        lb = [x[2] for x in b if x]
        each = " / ".join(f"{100 * x:+.1f}" for x in la)
        mixed_each = " / ".join(f"{100 * x:+.1f}" for x in lb)
        ratio = _mean(lb) / _mean(la) if sum(la) else float("nan")
        per_seed = " / ".join(f"{y / x:.2f}" if x else "-" for x, y in zip(la, lb, strict=True))
        rows.append(f"| {domain} | {family} | {each} | {mixed_each} | **{ratio:.2f}** ({per_seed}) |")
    return rows


def sequential_table(
    results: dict[tuple[str, int], dict[str, Any]], seeds: list[int], workspace: Path
) -> list[str]:
    """Per order: the first domain's lift after its own run and after the second's, and the
    second domain's lift over the starting student."""
    rows = [
        "| order | first domain: lift after its run | after the second | kept | second domain: lift |",
        "|---|---|---|---|---|",
    ]
    for case, (first, second) in SEQUENTIAL.items():
        own, kept_lifts, second_lifts = [], [], []
        for s in seeds:
            one = lift(results.get((first, s), {}), first)
            two = lift(results.get((case, s), {}), second)
            path = workspace / EVALS / f"{run_name(case, s)}.json"
            if one is None or two is None or not path.exists():
                break
            start = lift(results.get((second, s), {}), second)  # the second domain's own start
            own.append(one[2])
            kept_lifts.append(json.loads(path.read_text())["accuracy"] - one[0])
            second_lifts.append(two[1] - (start[0] if start else two[0]))
        if len(own) < len(seeds):
            rows.append(f"| {first}, then {second} | missing | missing | - | missing |")
            continue
        kept = _mean(kept_lifts) / _mean(own) if sum(own) else float("nan")
        rows.append(
            f"| {first}, then {second} | {' / '.join(f'{100 * x:+.1f}' for x in own)} | "
            f"{' / '.join(f'{100 * x:+.1f}' for x in kept_lifts)} | {kept:.2f} | "
            f"{' / '.join(f'{100 * x:+.1f}' for x in second_lifts)} |"
        )
    return rows


def plot(results: dict[tuple[str, int], dict[str, Any]], seeds: list[int], out: Path, mixed: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    panels = (
        ("rlve", (("rlve", "alone"), (mixed, "mixed"), (f"{mixed}-llama", "mixed (dapo: llama)"))),
        (
            "dapo",
            (
                ("dapo", "alone"),
                (mixed, "mixed"),
                ("dapo-llama", "alone, llama"),
                (f"{mixed}-llama", "mixed, llama"),
            ),
        ),
    )
    for ax, (domain, pairs) in zip(axes, panels, strict=True):
        for i, (case, _label) in enumerate(pairs):
            lifts = [x[2] * 100 for s in seeds if (x := lift(results.get((case, s), {}), domain))]
            ax.bar(i, sum(lifts) / max(len(lifts), 1), color="C0" if "mixed" in case else "C7")
            ax.scatter([i] * len(lifts), lifts, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(pairs)), [label for _, label in pairs], rotation=20, fontsize=8)
        ax.set_title(f"{domain}: lift of the same student (points)")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--workspace", type=Path, default=Path("workspace"))
    parser.add_argument("--steps-scale", type=float, default=1.0, help="fraction of the presets' steps")
    parser.add_argument("--eval-items", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--set", action="append", default=[], help="an override for the --set-cases runs")
    parser.add_argument("--set-cases", default="mixed,mixed-llama", help="the cases --set applies to")
    parser.add_argument("--name", default="", help="the variant's name (in its runs' names), with --set")
    parser.add_argument("--out", type=Path, default=None, help="write <out>.md and <out>.png")
    args = parser.parse_args()
    args.workspace = args.workspace.resolve()
    args.set_cases = args.set_cases.split(",") if args.set else []
    if args.set and not args.name:
        parser.error("--set needs --name (the variant's runs are kept beside the preset's)")
    seeds = [int(s) for s in args.seeds.split(",")]
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"--cases: unknown case {unknown[0]} (cases: {', '.join(CASES)})")
    zoo = zoo_paths(args.workspace)
    run_all([make_job(c, s, args, zoo) for s in seeds for c in cases], args, zoo)
    results = {
        (case, seed): _summary(args.workspace, make_job(case, seed, args, zoo).name)
        for seed in seeds
        for case in CASES
    }
    mixed = "mixed"
    lines = table(results, seeds, mixed) + [""] + sequential_table(results, seeds, args.workspace)
    print("\n".join(lines))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        plot(results, seeds, args.out, mixed)


if __name__ == "__main__":
    main()
