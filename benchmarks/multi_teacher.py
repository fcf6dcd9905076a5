"""Multi-teacher OPD against the single-domain runs, from the same starting student.

One student (the mixed zoo's `zoo:student`, built from both domains' slices) is trained

- on rlve alone by rlve's teacher, and on dapo alone by dapo's teacher (each domain's OPD preset);
- on both at once, each row by its own domain's teacher (`configs/rlve+dapo/opd.yaml`: the two
  presets' steps together, its own prompt mix and lr);
- and the same with dapo's teacher of another tokenizer family (`teacher-llama`), alone and mixed.

The teachers are the mixed zoo's `teacher@rlve`, `teacher@dapo` and `teacher-llama@dapo`: each
trained on its own domain, the first two with the student's tokenizer. Each domain's lift
(after - before, on its own eval items) of the mixed run is divided by its single-domain lift.

    python benchmarks/multi_teacher.py --seeds 0,1,2 --out docs/img/multi_teacher
    python benchmarks/multi_teacher.py --seeds 0 --steps-scale 0.1 --eval-items 50   # a quick look

Runs go to `--workspace` (default ./workspace); a finished run is kept and not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Case names: one domain alone (rlve, dapo), both in one run (mixed); -llama: dapo's teacher is the
# cross-family one. `case_args` names each case's student and teachers.
CASES = ("rlve", "dapo", "mixed", "dapo-llama", "mixed-llama")
PRESET_STEPS = {"rlve": 200, "dapo": 400, "rlve+dapo": 600}


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


def case_args(case: str, zoo: dict[str, str]) -> list[str]:
    student = f"student.name={zoo['student']}"
    if case == "rlve":
        return ["--domain", "rlve", student, f"teacher.name={zoo['teacher@rlve']}"]
    if case == "dapo":
        return ["--domain", "dapo", student, f"teacher.name={zoo['teacher@dapo']}"]
    if case == "dapo-llama":
        return ["--domain", "dapo", student, f"teacher.name={zoo['teacher-llama@dapo']}"]
    teachers = [f"teachers.rlve.name={zoo['teacher@rlve']}"]
    dapo = zoo["teacher-llama@dapo"] if case == "mixed-llama" else zoo["teacher@dapo"]
    return ["--domain", "rlve,dapo", student, *teachers, f"teachers.dapo.name={dapo}"]


def run(case: str, seed: int, zoo: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """One run (kept when it finished already); its summary."""
    name = f"mt-{case}-s{seed}"
    folder = args.workspace / "runs" / name
    summary_path = folder / "summary.json"
    if summary_path.exists() and json.loads(summary_path.read_text()).get("status") == "FINISHED":
        return dict(json.loads(summary_path.read_text()))
    domain = "rlve+dapo" if case.startswith("mixed") else case.split("-")[0]
    steps = max(1, round(PRESET_STEPS[domain] * args.steps_scale))
    cmd = [sys.executable, "-m", "distill", "run", "--method", "opd", *case_args(case, zoo)]
    cmd += [f"seed={seed}", f"optim.max_steps={steps}", f"eval.items={args.eval_items}"]
    cmd += [f"tracking.run_name={name}", "rollout.async_teacher=false"]
    env = {**os.environ, "DISTILL_WORKSPACE": str(args.workspace)}
    start = time.time()
    log = args.workspace / f"{name}.log"
    with log.open("w") as fh:
        code = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    print(f"{name}: exit {code} in {time.time() - start:.0f} s ({log})", flush=True)
    return dict(json.loads(summary_path.read_text())) if summary_path.exists() else {"status": f"exit {code}"}


def lift(summary: dict[str, Any], domain: str) -> tuple[float, float, float] | None:
    """(before, after, after - before) accuracy on `domain`'s eval items."""
    parts = summary.get("parts") or {}
    scores = parts.get(domain) or (summary if summary.get("domain") == domain else None)
    if not scores or "student_after" not in scores:
        return None
    before, after = scores["student_before"]["accuracy"], scores["student_after"]["accuracy"]
    return before, after, after - before


def table(results: dict[tuple[str, int], dict[str, Any]], seeds: list[int]) -> list[str]:
    rows = [
        "| domain | teacher family | single-domain lift | mixed-run lift | mixed / single |",
        "|---|---|---|---|---|",
    ]
    for domain, single, mixed, family in (
        ("rlve", "rlve", "mixed", "same"),
        ("dapo", "dapo", "mixed", "same"),
        ("rlve", "rlve", "mixed-llama", "same (beside a cross-family dapo teacher)"),
        ("dapo", "dapo-llama", "mixed-llama", "cross (llama)"),
    ):
        a = [lift(results.get((single, s), {}), domain) for s in seeds]
        b = [lift(results.get((mixed, s), {}), domain) for s in seeds]
        if any(x is None for x in a + b):
            rows.append(f"| {domain} | {family} | missing | missing | - |")
            continue
        la = [x[2] for x in a if x]
        lb = [x[2] for x in b if x]
        each = " / ".join(f"{100 * x:+.1f}" for x in la)
        mixed_each = " / ".join(f"{100 * x:+.1f}" for x in lb)
        ratio = (sum(lb) / len(lb)) / (sum(la) / len(la)) if sum(la) else float("nan")
        rows.append(f"| {domain} | {family} | {each} | {mixed_each} | {ratio:.2f} |")
    return rows


def plot(results: dict[tuple[str, int], dict[str, Any]], seeds: list[int], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, (domain, pairs) in zip(
        axes,
        (
            ("rlve", (("rlve", "alone"), ("mixed", "mixed"), ("mixed-llama", "mixed (dapo: llama)"))),
            (
                "dapo",
                (
                    ("dapo", "alone"),
                    ("mixed", "mixed"),
                    ("dapo-llama", "alone, llama"),
                    ("mixed-llama", "mixed, llama"),
                ),
            ),
        ),
        strict=True,
    ):
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
    parser.add_argument("--out", type=Path, default=None, help="write <out>.md and <out>.png")
    args = parser.parse_args()
    args.workspace = args.workspace.resolve()
    seeds = [int(s) for s in args.seeds.split(",")]
    zoo = zoo_paths(args.workspace)
    results = {(case, seed): run(case, seed, zoo, args) for seed in seeds for case in args.cases.split(",")}
    lines = table(results, seeds)
    print("\n".join(lines))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        plot(results, seeds, args.out)


if __name__ == "__main__":
    main()
