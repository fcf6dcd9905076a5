"""One OPD step, side by side: a plain-PyTorch floor, distill OPD per loss, TRL's DistillationTrainer.

All systems run in this process on the same models (the zoo pair), the same prompt pool, batch
and token budget, interleaved step by step (interleave.py: one step per turn, round robin), and
the table reports medians after warm-up. Each keeps its own loop: distill runs `execute` (the
whole `distill run` path, MLflow store, metrics.jsonl and samples included), TRL its `train()`,
the floor the loop below. Phases: generation, teacher, student forward+backward, optimizer, and
`other` (for distill, its own overhead around the math; for TRL, its trainer's bookkeeping).

The floor is the same math as `method.loss=token_reward_direct` with nothing around it: HF
generate with a KV cache -> teacher logprobs -> student logprobs -> loss -(A * logp_S) with
A = logp_T - logp_S (detached), summed over completion tokens / their count -> clip -> AdamW.

    python benchmarks/opd_step.py                          # 32 rollouts x 64 tokens, all systems
    python benchmarks/opd_step.py --rows 8 --tokens 256
    python benchmarks/opd_step.py --systems floor,distill:token_reward_direct --profile distill:token_reward_direct
    python benchmarks/opd_step.py --systems distill:jsd,distill:jsd:compiled     # torch.compile vs eager
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import interleave  # noqa: E402
from interleave import PHASES, Baton, medians, region, trainer_callback, wrap  # noqa: E402

LOSSES = ("token_reward_direct", "k1", "k3", "forward_kl_topk", "jsd")
# `distill:<loss>:compiled`: the same run with kernels.compile=on (the chunk reductions under
# torch.compile, kernels/compiled.py), beside the eager one in the same process.
SYSTEMS = (
    "floor",
    *(f"distill:{loss}" for loss in LOSSES),
    "trl:distillation",
    *(f"distill:{loss}:compiled" for loss in LOSSES),
)
DEFAULT_SYSTEMS = SYSTEMS[: len(LOSSES) + 2]


def fixed_length() -> None:
    """Every rollout exactly max_new_tokens long (EOS suppressed until then), in every system: the
    same token budget per step, whatever each system's weights have drifted to."""
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("generation_config")
        budget = kwargs.get("max_new_tokens") or getattr(config, "max_new_tokens", None)
        if interleave.current() is not None and budget:
            kwargs["min_new_tokens"] = budget
        return original(self, *args, **kwargs)

    GenerationMixin.generate = generate  # type: ignore[method-assign]


def instrument() -> None:
    """Class-level regions: every system's thread charges its own Phases (interleave.py)."""
    from trl import DistillationTrainer, GRPOTrainer

    from distill.engines.hf import HFEngine

    for cls in (GRPOTrainer, DistillationTrainer):
        interleave.count_tokens(cls, "_generate", 1)
        wrap(cls, "_generate", "generation")
        wrap(cls, "training_step", "student")
        wrap(cls, "_prepare_inputs", "other")  # inside training_step: the batch's bookkeeping
    wrap(HFEngine, "score", "teacher")
    # TRL runs the teacher's backbone inside its loss, under no_grad; the student's with grad.
    wrap(
        DistillationTrainer,
        "_get_last_hidden_state",
        lambda *a, **k: "student" if torch.is_grad_enabled() else "teacher",
    )
    wrap(torch.optim.AdamW, "step", "optimizer")
    wrap(torch.nn.utils, "clip_grad_norm_", "optimizer")


def pair_paths(pair: str) -> tuple[str, str]:
    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    names = names_for(pair)
    domain, settings = domain_config("rlve"), get_settings()
    return resolve_model(names[0], domain, settings), resolve_model(names[1], domain, settings)


def names_for(pair: str) -> tuple[str, str]:
    return ("zoo:student", "zoo:teacher") if pair == "zoo" else ("zoo:student-qwen3", "zoo:teacher-qwen3")


def prompts_pool() -> list[str]:
    from distill.config import domain_config
    from distill.domains import build_domain

    domain = build_domain(domain_config("rlve"))
    try:
        return [item.prompt for item in domain.train_items()]
    finally:
        domain.close()


def distill_system(system: str, args: argparse.Namespace, baton: Baton, name: str, workspace: Path) -> None:
    from distill.config import resolve_config
    from distill.runner import execute
    from distill.settings import Settings, get_settings

    loss, _, variant = system.partition(":")
    student, teacher = names_for(args.pair)
    overrides = [
        f"kernels.compile={'on' if variant == 'compiled' else 'off'}",
        f"student.name={student}",
        f"teacher.name={teacher}",
        f"method.loss={loss}",
        f"rollout.prompts_per_step={args.rows // 2}",
        "rollout.num_generations=2",
        f"rollout.max_new_tokens={args.tokens}",
        f"rollout.temperature={args.temperature}",
        f"optim.lr={args.lr}",
        f"optim.max_steps={args.warmup + args.steps + 1}",
        "checkpoint.every_steps=0",
        # The step itself, scored in this process like TRL's (benchmarks/async_teacher.py times
        # the teacher in its worker).
        "rollout.async_teacher=false",
        "eval.items=4",
        "eval.max_new_tokens=8",
        "eval.eval_teacher=false",
        f"threads={args.threads}",
        "tracking.experiment=opd-step-bench",
        f"tracking.run_name=bench-{loss}-{variant or 'eager'}-{uuid.uuid4().hex[:6]}",
    ]
    if loss == "jsd":
        overrides.append("method.beta=1.0")  # reverse KL, TRL's beta=1
    settings = Settings(workspace=workspace, zoo_dir=get_settings().zoo_path.resolve())
    config = resolve_config("rlve", "opd", overrides=overrides)
    execute(
        config, settings, argv=["opd_step.py"], say=lambda _: None, callbacks=[trainer_callback(baton, name)]
    )


def trl_system(args: argparse.Namespace, baton: Baton, name: str, workspace: Path, pool: list[str]) -> None:
    from datasets import Dataset
    from trl import DistillationConfig, DistillationTrainer

    from distill.engines.hf import HFEngine

    torch.set_num_threads(args.threads)
    student_path, teacher_path = pair_paths(args.pair)
    student, teacher = HFEngine.load(student_path), HFEngine.load(teacher_path)
    config = DistillationConfig(
        output_dir=str(workspace / "trl"),
        per_device_train_batch_size=args.rows,
        max_completion_length=args.tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        beta=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        max_steps=args.warmup + args.steps + 1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        fp16=False,
        use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=False,
        disable_tqdm=True,
        seed=42,
    )
    trainer = DistillationTrainer(
        model=student.model,
        teacher_model=teacher.model,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in pool]),
        processing_class=student.tokenizer,
        callbacks=[trainer_callback(baton, name)],
    )
    trainer.train()


def floor_system(args: argparse.Namespace, baton: Baton, name: str, pool: list[str]) -> None:
    """token_reward_direct in plain PyTorch, nothing around it."""
    from distill.engines.hf import HFEngine

    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    student_path, teacher_path = pair_paths(args.pair)
    student, teacher = HFEngine.load(student_path), HFEngine.load(teacher_path)
    model, tok = student.model, student.tokenizer
    model.train()
    # The Trainers' default optimizer (adamw_torch_fused).
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=True)
    eos = sorted(student.eos_ids)
    rng = random.Random(42)
    for _ in range(args.warmup + args.steps + 1):
        baton.boundary(name)
        prompts = [p for p in rng.sample(pool, args.rows // 2) for _ in range(2)]
        with region("generation"):
            rows = [
                tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
                for p in prompts
            ]
            rows = [r["input_ids"] if isinstance(r, dict) or hasattr(r, "keys") else r for r in rows]
            prompt_B_P, pmask_B_P = student.left_pad(rows)
            with torch.no_grad():
                out_B_L = model.generate(
                    input_ids=prompt_B_P,
                    attention_mask=pmask_B_P,
                    do_sample=True,
                    temperature=args.temperature,
                    top_p=1.0,
                    top_k=0,
                    max_new_tokens=args.tokens,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=eos,
                )
            width_P = prompt_B_P.shape[1]
            comp_B_T = out_B_L[:, width_P:]
            is_eos_B_T = torch.isin(comp_B_T, torch.tensor(eos))
            # Up to and including the first EOS.
            cmask_B_T = (is_eos_B_T.int().cumsum(1) - is_eos_B_T.int() == 0).float()
            interleave.current().tokens += int(cmask_B_T.sum())  # type: ignore[union-attr]
        ids_B_L = torch.cat([prompt_B_P, comp_B_T], 1)
        mask_B_L = torch.cat([pmask_B_P, cmask_B_T.long()], 1)
        with region("teacher"), torch.no_grad():
            t_logits = teacher.model(input_ids=ids_B_L, attention_mask=mask_B_L).logits[:, width_P - 1 : -1]
            logp_T = torch.log_softmax(t_logits.float(), -1).gather(-1, comp_B_T[..., None])[..., 0]
        with region("student"):
            s_logits = model(input_ids=ids_B_L, attention_mask=mask_B_L).logits[:, width_P - 1 : -1]
            logp_S = torch.log_softmax(s_logits.float(), -1).gather(-1, comp_B_T[..., None])[..., 0]
            adv = (logp_T - logp_S).detach()
            loss = -(adv * logp_S * cmask_B_T).sum() / cmask_B_T.sum().clamp(min=1)
            loss.backward()
        with region("optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)


def run_shape(args: argparse.Namespace, systems: list[str], workspace: Path) -> dict[str, dict[str, float]]:
    pool = prompts_pool()
    baton = Baton(systems)
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        baton.profile = (args.profile, args.warmup, profiler)
    bodies = {
        "floor": lambda: floor_system(args, baton, "floor", pool),
        "trl:distillation": lambda: trl_system(args, baton, "trl:distillation", workspace, pool),
    }
    threads = []
    for name in systems:
        body = bodies.get(name) or (
            lambda n=name: distill_system(n.split(":", 1)[1], args, baton, n, workspace)
        )
        threads.append(baton.run(name, body))
    for thread in threads:
        thread.join()
    for name, exc in baton.errors.items():
        print(f"{name}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative")
        print(f"\nprofile of {args.profile} (measured steps, cumulative):", file=sys.stderr)
        stats.print_stats(30)
        print(f"\n{args.profile}: distill's own code (cumulative):", file=sys.stderr)
        stats.print_stats(r"/distill/(methods|tracking|progress|engines|domains)", 30)
    return {name: medians(baton.steps[name], args.warmup) for name in systems if name not in baton.errors}


def table(results: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    floor = results.get("floor", {}).get("total")
    trl = results.get("trl:distillation", {}).get("total")
    lines = [
        f"{args.rows} rollouts x {'<= ' if args.free_length else ''}{args.tokens} new tokens, {args.pair} pair, "
        f"rollout temperature "
        f"{args.temperature}, {args.threads} thread(s); medians of {args.steps} interleaved steps after "
        f"{args.warmup} warm-up (seconds)",
        "",
        "| system | s/step | / floor | / TRL | tokens/step | " + " | ".join(PHASES) + " |",
        "|---|---|---|---|---|" + "---|" * len(PHASES),
    ]
    for name, m in results.items():
        if not m:
            continue
        vs_floor, vs_trl = (f"{m['total'] / ref:.2f}" if ref else "-" for ref in (floor, trl))
        phases = " | ".join(f"{m[p]:.3f}" for p in PHASES)
        lines.append(f"| {name} | {m['total']:.3f} | {vs_floor} | {vs_trl} | {m['tokens']:.0f} | {phases} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--systems", default=",".join(DEFAULT_SYSTEMS), help=f"comma list of: {', '.join(SYSTEMS)}"
    )
    parser.add_argument("--pair", choices=("zoo", "qwen3"), default="zoo")
    parser.add_argument("--rows", type=int, default=32, help="rollouts per step (prompts x 2 generations)")
    parser.add_argument("--tokens", type=int, default=64, help="max new tokens per rollout")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--steps", type=int, default=12, help="measured steps per system")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", help="cProfile this system's measured steps (to stderr)")
    parser.add_argument(
        "--free-length", action="store_true", help="let rollouts end at EOS (default: exactly --tokens each)"
    )
    parser.add_argument("--out", type=Path, help="append the table to this markdown file")
    parser.add_argument("--json", type=Path, help="write the medians here")
    args = parser.parse_args()
    for var, value in (
        ("MLFLOW_DISABLE_TELEMETRY", "true"),
        ("DVC_NO_ANALYTICS", "1"),
        ("HF_HUB_OFFLINE", "1"),
    ):
        os.environ.setdefault(var, value)
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or args.rows % 2:
        sys.exit(f"opd_step: unknown systems {unknown}" if unknown else "opd_step: --rows must be even")
    torch.set_num_threads(args.threads)
    pair_paths(args.pair)  # build the zoo pair once, before any timing
    instrument()
    if not args.free_length:
        fixed_length()
    with tempfile.TemporaryDirectory(prefix="opd-step-") as tmp:
        results = run_shape(args, systems, Path(tmp))
    text = table(results, args)
    print(text, flush=True)
    if args.out:
        with args.out.open("a") as fh:
            fh.write(text + "\n\n")
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"out": None, "json": None}, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
