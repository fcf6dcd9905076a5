"""Step time of the chunked scoring/loss paths against the full-logits forms they replaced, on the
embedded default (zoo student/teacher, V ~ 1k) and at the real vocabulary (the real-shape pair).

Each pair runs side by side in this process, interleaved call by call on the same batch, and the
table reports medians after warm-up and their ratio (chunked / full). The full-logits forms are
written here, as the code had them: `model(...).logits` then log_softmax, gather, top-k; TRL's fused
head for GRPO's per-token logps (GRPOTrainer's own); transformers' own CE loss.

    python benchmarks/head_paths.py --pair zoo                 # the embedded default pair
    python benchmarks/head_paths.py --pair qwen3 --rows 8 --tokens 256
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def load_pair(which: str) -> tuple[Any, Any]:
    from distill.config import domain_config
    from distill.engines.hf import HFEngine
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    names = ("zoo:student", "zoo:teacher") if which == "zoo" else ("zoo:student-qwen3", "zoo:teacher-qwen3")
    domain, settings = domain_config("rlve"), get_settings()
    return tuple(HFEngine.load(resolve_model(n, domain, settings)) for n in names)  # type: ignore[return-value]


def rollout(student: Any, rows: int, tokens: int) -> dict[str, Any]:
    from distill.engines.base import right_pad

    torch.manual_seed(0)
    prompts = [student.prompt_ids(f"Sort these numbers: {i} 7 3 9 1.") for i in range(rows)]
    completions = torch.randint(0, min(len(student.tokenizer), 151_643) - 1, (rows, tokens)).tolist()
    prompt_ids, prompt_mask = student.left_pad(prompts)
    comp_ids, comp_mask = right_pad(completions, int(student.tokenizer.pad_token_id))
    return {
        "prompts": prompts,
        "completions": completions,
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": comp_ids,
        "completion_mask": comp_mask,
    }


def full_logprobs(model: Any, b: dict[str, Any], grad: bool) -> torch.Tensor:
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    mask = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
    width_P, width_T = b["prompt_ids"].shape[1], b["completion_ids"].shape[1]
    with torch.set_grad_enabled(grad):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, width_P - 1 : width_P - 1 + width_T]
        return torch.log_softmax(logits.float(), dim=-1)


def pairs(
    student: Any, teacher: Any, b: dict[str, Any]
) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """name -> (full-logits form, chunked form), each one call of that step part."""

    from distill.config import OPDMethod
    from distill.kernels import losses
    from distill.kernels.states import ce_loss, completion_logprobs
    from distill.methods.signal import Signal
    from distill.tracking.base import NullTracker
    from distill.tracking.steplog import SilentLog

    mask = b["completion_mask"].bool()
    scores = teacher.score(b["prompts"], b["completions"], top_k=32)
    inputs = {k: v for k, v in b.items() if isinstance(v, torch.Tensor)}
    inputs["teacher_logps"] = scores.logprobs_B_T
    inputs["teacher_topk_ids"], inputs["teacher_topk_logps"] = scores.topk()

    def divergence_loss(loss: str) -> Any:
        signal = Signal(OPDMethod(loss=loss, top_k=32), SilentLog(NullTracker()))
        return signal.divergence_loss(0, student.model, student.model, inputs)

    def full_score() -> Any:
        lp = full_logprobs(teacher.model, b, False)
        return lp.gather(-1, b["completion_ids"][..., None]), lp.topk(32, -1)

    def full_topk_loss() -> None:
        ls = full_logprobs(student.model, b, True)
        at = ls.gather(-1, inputs["teacher_topk_ids"])[mask]
        losses.topk_forward_kl_per_token(at, inputs["teacher_topk_logps"][mask]).mean().backward()

    def full_k3_loss() -> None:
        ls = full_logprobs(student.model, b, True).gather(-1, b["completion_ids"][..., None])[..., 0]
        losses.direct_kl_per_token("k3", ls[mask], inputs["teacher_logps"][mask]).mean().backward()

    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    attn = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
    labels = ids.masked_fill(attn == 0, -100)
    labels[:, : b["prompt_ids"].shape[1]] = -100
    width = b["completion_ids"].shape[1]

    def fused_grpo() -> None:  # what GRPOTrainer ran before: TRL's fused LM head
        lp = student.model(input_ids=ids, attention_mask=attn, labels=labels, fused_lm_head=True).log_probs[
            :, -width:
        ]
        (-(torch.exp(lp - lp.detach()) * mask).sum() / mask.sum()).backward()

    def chunked_grpo() -> None:
        lp, _, _ = completion_logprobs(student.model, student.model, ids, attn, width)
        (-(torch.exp(lp - lp.detach()) * mask).sum() / mask.sum()).backward()

    return {
        "teacher score + top-32": (
            full_score,
            lambda: teacher.score(b["prompts"], b["completions"], top_k=32),
        ),
        "forward_kl_topk fwd+bwd": (
            full_topk_loss,
            lambda: divergence_loss("forward_kl_topk").backward(),
        ),
        "k3 fwd+bwd": (
            full_k3_loss,
            lambda: divergence_loss("k3").backward(),
        ),
        "GRPO logps fwd+bwd (TRL fused head before)": (fused_grpo, chunked_grpo),
        "CE fwd+bwd (rose, sft)": (
            lambda: student.model(input_ids=ids, attention_mask=attn, labels=labels).loss.backward(),
            lambda: ce_loss(
                student.model, student.model, {"input_ids": ids, "attention_mask": attn, "labels": labels}
            ).backward(),
        ),
    }


def timed(fn: Callable[[], Any], model: Any) -> float:
    start = time.perf_counter()
    fn()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=("zoo", "qwen3"), default="zoo")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    torch.set_num_threads(args.threads)
    student, teacher = load_pair(args.pair)
    student.model.train()
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(student.model)  # `fused_lm_head=True` only where asked: TRL's GRPO path
    b = rollout(student, args.rows, args.tokens)
    vocab = student.model.config.vocab_size
    print(
        f"{args.pair} pair, V={vocab}, {args.rows} rows x {args.tokens} tokens, {args.threads} thread(s), "
        f"medians of {args.repeats} after {args.warmup} warm-up, interleaved"
    )
    print("| part | full logits (s) | chunked (s) | chunked / full |\n|---|---|---|---|")
    for name, (full, chunked) in pairs(student, teacher, b).items():
        times: dict[str, list[float]] = {"full": [], "chunked": []}
        for i in range(args.warmup + args.repeats):
            for label, fn in (
                (("full", full), ("chunked", chunked))
                if i % 2 == 0
                else (("chunked", chunked), ("full", full))
            ):
                t = timed(fn, student.model)
                if i >= args.warmup:
                    times[label].append(t)
        f, c = statistics.median(times["full"]), statistics.median(times["chunked"])
        print(f"| {name} | {f:.4f} | {c:.4f} | {c / f:.2f} |", flush=True)


if __name__ == "__main__":
    main()
