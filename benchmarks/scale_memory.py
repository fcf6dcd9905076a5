"""Peak memory of one step of each kind at Qwen's real vocabulary, against the sequence length.

Setup: the real-shape zoo pair (`zoo:student-qwen3` d64 / `zoo:teacher-qwen3` d128, 2 layers,
V = 151,936, Qwen3's real tokenizer and template, random weights), B rows of T completion tokens
after a real chat prompt. Each (kind, T) runs in a fresh subprocess, which loads the models, then
resets its peak-RSS mark (/proc/self/clear_refs) and runs one step; the figure is the peak RSS
the step added over the loaded weights. Beside it, the naive estimate B*T*V*4*2 bytes (fp32
logits and their log_softmax).

Step kinds (distill's own step code on the trainer's batch layout; generation is not included,
its KV cache is B*T*layers*kv_heads*head_dim, not vocabulary-sized):
- teacher_score: the teacher's logprobs of the sampled tokens and its top-32 (one engine call);
- opd:<loss>: student and teacher scoring, the advantages, the loss forward + backward and an
  AdamW step; token_reward_direct: GRPOTrainer's loss on the per-token logps distill's trainer
  gives it; the divergence losses (jsd included) through `methods.signal.Signal.divergence_loss`;
- opd-xf:<loss>: the same OPD step through the cross-family path (methods/cross_family.py) with
  `method.cross_family=always`, which forces it for the one tokenizer the pair shares: each row
  aligned into byte groups, the group targets on the batch grid, the group loss through the same
  chunked head; the pair's CrossFamily (bridge, vocabulary map) is built before the peak is reset,
  as a run builds it once;
- rose: CE on the teacher's continuation (the second half of each row) + AdamW;
- sft: CE on the whole completion (distill's SFTTrainer loss) + AdamW;
- opsd: the student scored under its plain prompt and, frozen, under a privileged prompt ~3x as
  long, token_reward_direct loss + AdamW;
- trl:grpo, trl:sft: the same GRPO / SFT losses through TRL 1.16's own fused LM head, which distill
  replaces (on CPU its tiles are [4096 tokens, 32768 vocab] in fp32).

    python benchmarks/scale_memory.py                      # the full table, B=8, T=512..8192
    python benchmarks/scale_memory.py --lengths 1024 --batch 2 --kinds teacher_score,opd:k3 --json
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

KINDS = (
    "teacher_score",
    "opd:token_reward_direct",
    "opd:k1",
    "opd:k3",
    "opd:forward_kl_topk",
    "opd:jsd",
    "opd-xf:token_reward_direct",
    "opd-xf:forward_kl_topk",
    "rose",
    "sft",
    "opsd",
)
VOCAB = 151_936
TOP_K = 32
# opd-xf kinds: the step's alignment figures (kl/aligned_share, bridge/seam_failure_rate, ...),
# reported beside the memory so a test can see the cross path really supervised the tokens.
FIGURES: dict[str, float] = {}


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux clear_refs 5), so the peak is this step's."""
    Path("/proc/self/clear_refs").write_text("5")


def build_pair(workspace: Path) -> tuple[str, str]:
    """The real-shape pair, built on first use in the workspace's zoo."""
    os.environ["DISTILL_WORKSPACE"] = str(workspace)
    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    domain, settings = domain_config("rlve"), get_settings()
    return (
        resolve_model("zoo:student-qwen3", domain, settings, show_progress=False),
        resolve_model("zoo:teacher-qwen3", domain, settings, show_progress=False),
    )


def batch(engine: Any, rows: int, tokens: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    prompts = [
        engine.prompt_ids(f"Sort these numbers: {i} 7 3 9 1. Put your answer in \\boxed{{}}.")
        for i in range(rows)
    ]
    # Ordinary tokens only (below the added tokens), as a sampled response would mostly be.
    completions = torch.randint(0, 151_643, (rows, tokens), generator=g).tolist()
    return prompts, completions


def trainer_inputs(student: Any, prompts: list[list[int]], completions: list[list[int]]) -> dict[str, Any]:
    """The on-policy trainer's batch layout: left-padded prompts, right-padded completions."""
    from distill.engines.base import right_pad

    prompt_ids, prompt_mask = student.left_pad(prompts)
    comp_ids, comp_mask = right_pad(completions, int(student.tokenizer.pad_token_id))
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": comp_ids,
        "completion_mask": comp_mask,
    }


def grpo_loss(model: Any, inputs: dict[str, Any], advantages: Any, fused: bool = False) -> Any:
    """GRPOTrainer's on-policy loss (ratio 1, dapo normalisation) on the per-token logps distill's
    OPDTrainer gives it (the chunked head), or, `fused`, TRL's own fused LM head for comparison."""
    import torch

    from distill.kernels.states import completion_logprobs

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    width = inputs["completion_ids"].shape[1]
    if fused:
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :-width] = -100
        logps = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).log_probs[
            :, -width:
        ]
    else:
        logps, _, _ = completion_logprobs(model, model, ids, mask, width)
    ratio = torch.exp(logps - logps.detach())
    comp_mask = inputs["completion_mask"]
    return -(ratio * advantages * comp_mask).sum() / comp_mask.sum()


def cross_family(kind: str, student: Any, teacher: Any) -> Any:
    """opd-xf kinds: the pair's CrossFamily with the cross path forced (None for other kinds)."""
    if not kind.startswith("opd-xf:"):
        return None
    from distill.config import OPDMethod
    from distill.methods.cross_family import CrossFamily

    method = OPDMethod(loss=kind.split(":")[1], top_k=TOP_K, cross_family="always")
    return CrossFamily(student.tokenizer, teacher.tokenizer, method)


def run_step(kind: str, student: Any, teacher: Any, rows: int, tokens: int, cross: Any = None) -> None:
    """One step of `kind` (see the module docstring)."""
    import torch

    prompts, completions = batch(student, rows, tokens)
    optim = torch.optim.AdamW(student.model.parameters(), lr=1e-6)
    if kind == "teacher_score":
        teacher.score(prompts, completions, top_k=TOP_K)
        return
    inputs = trainer_inputs(student, prompts, completions)
    if kind in ("rose", "sft", "trl:sft"):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        labels = ids.masked_fill(mask == 0, -100)
        # sft: the whole completion; rose: the teacher's continuation, the second half of each row.
        labels[:, : ids.shape[1] - (tokens // 2 if kind == "rose" else tokens)] = -100
        loss = _ce(kind, student.model, ids, mask, labels)
    else:
        loss = _on_policy_loss(kind, student, teacher, prompts, completions, inputs, cross)
    loss.backward()
    optim.step()


def _ce(kind: str, model: Any, ids: Any, mask: Any, labels: Any) -> Any:
    if kind == "trl:sft":  # TRL's own SFT loss (its fused head), for comparison
        return model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True).loss
    # distill's ROSE trainer and its SFTTrainer subclass: CE through the chunked head.
    from distill.kernels.states import ce_loss

    return ce_loss(model, model, {"input_ids": ids, "attention_mask": mask, "labels": labels})


def _on_policy_loss(
    kind: str,
    student: Any,
    teacher: Any,
    prompts: list[list[int]],
    completions: list[list[int]],
    inputs: dict[str, Any],
    cross: Any = None,
) -> Any:
    from distill.config import OPDMethod
    from distill.methods.scoring import token_advantages

    loss_name = kind.split(":")[1] if kind.startswith(("opd:", "opd-xf:")) else "token_reward_direct"
    if kind == "opsd":  # the frozen student under a privileged prompt ~3x as long
        teacher_prompts = [p + p[1:] + p[1:] for p in prompts]
        scorer = student
    else:
        teacher_prompts, scorer = prompts, teacher
    own = student.score(prompts, completions)
    top_k = TOP_K if loss_name == "forward_kl_topk" else 0
    if cross is not None:  # the teacher scores each row's crossed ids; targets per byte group
        return _cross_loss(cross, loss_name, student, teacher, own, (prompts, completions), inputs)
    theirs = scorer.score(teacher_prompts, completions, top_k=top_k)
    advantages, _ = token_advantages(OPDMethod(), theirs.logprobs_B_T, own.logprobs_B_T, own.mask_B_T)
    if loss_name == "token_reward_direct":
        return grpo_loss(student.model, inputs, advantages, fused=kind == "trl:grpo")
    inputs["teacher_logps"] = theirs.logprobs_B_T
    if top_k:
        inputs["teacher_topk_ids"], inputs["teacher_topk_logps"] = theirs.topk()
    if loss_name == "jsd":
        from distill.kernels.states import completion_states

        with __import__("torch").no_grad():
            inputs["teacher_hidden"] = completion_states(
                teacher.model,
                inputs["prompt_ids"],
                inputs["prompt_mask"],
                inputs["completion_ids"],
                inputs["completion_mask"],
            )
    signal = _signal(OPDMethod(loss=loss_name, top_k=TOP_K), teacher)
    return signal.divergence_loss(0, student.model, student.model, inputs)


def _signal(method: Any, teacher: Any, cross: Any = None) -> Any:
    """The trainer's loss side (methods/signal.py), its figures kept and dropped."""
    from distill.methods.signal import Signal
    from distill.tracking.base import NullTracker
    from distill.tracking.steplog import SilentLog

    head = teacher.model.get_output_embeddings() if method.loss == "jsd" else None
    return Signal(method, SilentLog(NullTracker()), cross, head)


def _cross_loss(
    cross: Any,
    loss_name: str,
    student: Any,
    teacher: Any,
    own: Any,
    batch: tuple[list[list[int]], list[list[int]]],
    inputs: dict[str, Any],
) -> Any:
    """opd-xf: align, score the crossed ids, place the group targets, and the group loss (the
    trainer's path: Signal.set_advantages / divergence_loss with the cross-family groups)."""
    from distill.config import OPDMethod
    from distill.methods.cross_family import group_advantages

    prompts, completions = batch
    samples = cross.align(completions)
    top_k = TOP_K if loss_name == "forward_kl_topk" else 0
    theirs = teacher.score(prompts, [s.teacher_ids for s in samples], top_k=top_k)
    targets, figures = cross.targets(samples, theirs, inputs["completion_mask"])
    FIGURES.update(figures)
    inputs.update(targets)
    method = OPDMethod(loss=loss_name, top_k=TOP_K, cross_family="always")
    if loss_name == "token_reward_direct":
        advantages, _ = group_advantages(method, cross.mode, inputs, own.logprobs_B_T.detach())
        return grpo_loss(student.model, inputs, advantages)
    return _signal(method, teacher, cross).divergence_loss(0, student.model, student.model, inputs)


def child(
    kind: str, tokens: int, rows: int, student_path: str, teacher_path: str, threads: int
) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    from distill.engines.hf import HFEngine

    student = HFEngine.load(student_path)
    teacher = HFEngine.load(teacher_path)
    student.model.train()
    if kind.startswith("trl:"):
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(student.model)
    for p in teacher.model.parameters():
        p.requires_grad_(False)
    cross = cross_family(kind, student, teacher)  # once per run, before the step's peak
    base_kb = rss_kb("VmRSS")
    reset_peak()
    start = time.perf_counter()
    run_step(kind, student, teacher, rows, tokens, cross)
    seconds = time.perf_counter() - start
    peak_kb = rss_kb("VmHWM")
    return {
        "kind": kind,
        "tokens": tokens,
        "rows": rows,
        "base_mb": base_kb / 1024,
        "added_mb": (peak_kb - base_kb) / 1024,
        "seconds": seconds,
        **({"figures": dict(FIGURES)} if FIGURES else {}),
    }


def measure(kind: str, tokens: int, rows: int, pair: tuple[str, str], threads: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        kind,
        "--lengths",
        str(tokens),
        "--batch",
        str(rows),
        "--threads",
        str(threads),
        "--pair",
        *pair,
    ]
    env = {
        **os.environ,
        "OMP_WAIT_POLICY": "PASSIVE",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} T={tokens}: {proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def naive_mb(rows: int, tokens: int) -> float:
    return rows * tokens * VOCAB * 4 * 2 / 2**20


def table(results: list[dict[str, Any]], kinds: list[str], lengths: list[int], rows: int) -> str:
    lines = ["| step | " + " | ".join(f"T={t}" for t in lengths) + " |", "|---|" + "---|" * len(lengths)]
    for kind in kinds:
        cells = []
        for t in lengths:
            r = next((r for r in results if r["kind"] == kind and r["tokens"] == t), None)
            cells.append("-" if r is None else f"{r['added_mb']:,.0f} MB ({r['seconds']:.0f} s)")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append("| naive B*T*V*4*2 | " + " | ".join(f"{naive_mb(rows, t):,.0f} MB" for t in lengths) + " |")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], kinds: list[str], lengths: list[int], rows: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for kind in kinds:
        pts = sorted((r["tokens"], r["added_mb"]) for r in results if r["kind"] == kind)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kind)
    ax.plot(lengths, [naive_mb(rows, t) for t in lengths], "k--", label="naive B*T*V*4*2")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("completion tokens T")
    ax.set_ylabel("peak RSS added by one step (MB)")
    ax.set_title(f"One step at V = {VOCAB:,}, B = {rows} (real-shape zoo pair, CPU)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workspace", type=Path, default=Path("workspace-bench"))
    parser.add_argument("--out", type=Path, default=None, help="write <out>.md and <out>.png")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON list")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--pair",
        nargs=2,
        default=None,
        metavar=("STUDENT", "TEACHER"),
        help="model folders (default: the zoo pair)",
    )
    args = parser.parse_args()
    lengths = [int(t) for t in args.lengths.split(",")]
    if args.child:
        print(json.dumps(child(args.child, lengths[0], args.batch, args.pair[0], args.pair[1], args.threads)))
        return
    kinds = args.kinds.split(",")
    pair = tuple(args.pair) if args.pair else build_pair(args.workspace.resolve())
    results = []
    for tokens in lengths:
        for kind in kinds:
            results.append(measure(kind, tokens, args.batch, pair, args.threads))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(results))
        return
    text = table(results, kinds, lengths, args.batch)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text + "\n")
        plot(results, kinds, lengths, args.batch, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
