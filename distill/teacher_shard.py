"""When a run may split its hf teacher over the training processes (`teacher.shard=true`).

A sharded teacher (kernels/sharded.py: `shard_for_inference`) holds 1/N of its weights on each
of the N ranks of an FSDP2 or ZeRO-3 launch and gathers one layer at a time in each forward, so
every forward is a collective: each rank must run the same number of teacher forwards, in the same
order. The teacher's scoring of the student's tokens does (each rank scores its slice of the step's
batch; `HFEngine.score` runs as many passes as the rank with the most). What a rank does with the
teacher alone cannot: generation (sft writes, rose continues: each rank's own lengths and stops),
rank 0's evaluation of the teacher, a worker process's scoring, an episode a rank may drop before
scoring. Those are refused here, in one line naming the field, before a run directory exists.
"""

from __future__ import annotations

from typing import Any

# What `launch.Plan.strategy` words mean, for the refusal's line.
_LAUNCHES = {"single": "one process", "ddp": "DDP", "deepspeed": "DeepSpeed below ZeRO-3"}


def refusal(config: Any, strategy: str) -> str | None:
    """Why `config` cannot run with a sharded teacher under the launch `strategy` (one line), or
    None (no teacher asks to be sharded, or it can be)."""
    from distill import registry

    parts = {f"teachers.{part}": spec for part, spec in config.teachers.items()}
    asked = [field for field, spec in {"teacher": config.teacher, **parts}.items() if spec.shard]
    if not asked:
        return None
    field = f"{asked[0]}.shard=true"
    if strategy not in ("fsdp", "zero3"):
        return (
            f"{field} splits the teacher over the processes of an FSDP2 or ZeRO-3 launch "
            f"(configs/accelerate/fsdp.yaml, zero3.yaml); this launch is {_LAUNCHES.get(strategy, strategy)}"
        )
    if len(registry.domain_parts(config.domain.name)) > 1:
        return f"{field}: a run over several domains scores each teacher on a rank's own rows; shard one domain's"
    spec = config.teacher
    if spec.engine == "server":
        return f"{field}: teacher.engine=server is split by its server (vLLM's tensor parallel); drop teacher.shard"
    # opsd's teacher (the student's own weights) refuses the field in the config itself.
    if registry.method_entry(config.method.name).teacher != "scores":
        return (
            f"{field}: method {config.method.name} generates with the teacher, and each rank's generation "
            "is its own (a sharded teacher runs only in step with every rank); serve it (teacher.engine=server)"
        )
    if registry.domain_entry(config.domain.name).episodic:
        return (
            f"{field}: on the episodic domain {config.domain.name} a rank scores only the episodes it "
            "kept, a count the ranks do not share; serve the teacher (teacher.engine=server)"
        )
    if config.rollout.async_teacher:
        return (
            f"{field}: rollout.async_teacher scores in a worker process of each rank, a sharded teacher "
            "only in step with every rank; set rollout.async_teacher=false"
        )
    if config.eval.eval_teacher:
        return (
            f"{field}: rank 0 evaluates the teacher alone (eval.eval_teacher=true), a sharded teacher "
            "answers only in step with every rank; set eval.eval_teacher=false"
        )
    return None
