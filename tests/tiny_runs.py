"""The settings of the tests' tiny OPD runs (tiny zoo models, one step, two eval items per domain)
on rlve or over rlve+dapo, shared by the tests that make one in-process or through the CLI."""

from __future__ import annotations

from typing import Any


def tiny_run_overrides(tiny_zoo: Any, name: str, mixed: bool, eval_teacher: bool = True) -> list[str]:
    """Dotted overrides of a one-step OPD run on rlve, or over rlve+dapo with a teacher named per
    domain (rlve at the tiny zoo's sizes, whose items are already materialised)."""
    d = tiny_zoo.domain
    if mixed:
        models = [f"teachers.{part}.name={tiny_zoo.teacher}" for part in ("rlve", "dapo")]
        sizes = [f"domain.parts.rlve.train_size={d.train_size}", f"domain.parts.rlve.eval_size={d.eval_size}"]
    else:
        models = [f"teacher.name={tiny_zoo.teacher}"]
        sizes = [f"domain.train_size={d.train_size}", f"domain.eval_size={d.eval_size}"]
    return [
        f"student.name={tiny_zoo.student}",
        *models,
        *sizes,
        "optim.max_steps=1",
        "checkpoint.every_steps=1",
        "rollout.prompts_per_step=2",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=8",
        "eval.items=2",
        "eval.max_new_tokens=8",
        f"eval.eval_teacher={str(eval_teacher).lower()}",
        "threads=1",
        f"tracking.run_name={name}",
    ]


def two_teachers_config(tiny_zoo: Any, *overrides: str) -> Any:
    """An OPD config over rlve and dapo: rlve's teacher of the student's family, dapo's of another."""
    from distill.config import resolve_config

    models = [
        f"student.name={tiny_zoo.student}",
        f"teachers.rlve.name={tiny_zoo.teacher}",
        f"teachers.dapo.name={tiny_zoo.teacher_llama}",
    ]
    return resolve_config("rlve,dapo", "opd", None, [*models, *overrides])
