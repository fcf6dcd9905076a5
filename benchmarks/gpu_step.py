"""The GPU table of issue 44, by the project's own code paths: teacher scoring, each OPD loss's
student step, the ROSE/SFT CE step and greedy decode, each as distill does it, against the naive
full-logits path, Liger-Kernel's fused linear losses (where they import: CUDA + liger-kernel) and
distill with its chunk loop's block arithmetic under torch.compile (CUDA). Paths of one row run
interleaved in one process (one call each per round, round robin), medians after warm-up.

Shapes (defaults): 8 x (256 + 4,096) tokens, V = 151,936, a Qwen3-1.7B student and a Qwen3-8B
teacher with random weights built from config on the device, bf16 on CUDA (fp32 on CPU).

  part    what is timed (benchmarks/gpu_paths.py)
  score   the teacher's top-32 + token logprobs: HFEngine.score vs model(...).logits
  opd     forward + backward of the student for each `method.loss` (token_reward_direct through
          kernels/states.completion_logprobs, k1, k3, forward_kl_topk, jsd), no optimizer step;
          gradient checkpointing on and/or off (`--ckpt`)
  ce      ROSE/SFT: kernels/states.ce_loss vs the model's own `labels=` loss vs Liger's fused CE
  decode  greedy, B x (prompt + new): HFEngine.continue_many (lean step, engines/decode.py) vs
          its model-call loop vs transformers' generate; new tokens/s

Time: CUDA-synchronised around each call. Peak: torch.cuda.max_memory_allocated over what was
allocated before the call (CUDA), the RSS high-water mark over the RSS before it (CPU, Linux;
freed heap is kept by the allocator, so later calls read low). MFU: distill.hardware (PaLM-style,
6 N + 12 L A S per training token, a third of it per scored token; the device's bf16 peak by
name, --peak-tflops to set it); none on the CPU. Each row is written to <out>.json and <out>.md
as it finishes; a row that runs out of memory, errs or passes --row-timeout-s is recorded as such
and the others still run; no new row starts after --budget-s.

    python benchmarks/gpu_step.py --smoke --out /tmp/gpu_step           # CPU, tiny shapes, seconds
    python benchmarks/gpu_step.py --out "$OUT/gpu_step" --budget-s 480  # one GPU (docs/gpu.md)
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gpu_paths as paths  # noqa: E402
import gpu_report  # noqa: E402

from distill import hardware  # noqa: E402
from distill.config import Sampling  # noqa: E402
from distill.engines.hf import HFEngine  # noqa: E402
from distill.kernels.heads import default_chunk_rows  # noqa: E402

LOSSES = "token_reward_direct,k1,k3,forward_kl_topk,jsd"
OOM = tuple(
    k for k in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if k
)
Paths = dict[str, tuple[paths.Step, Callable[[], None] | None]]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny models and shapes (CPU, seconds)")
    p.add_argument("--out", type=Path, default=Path("gpu_step"), help="writes <out>.json and <out>.md")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"], help="auto: bf16 on CUDA")
    p.add_argument("--parts", default="score,opd,ce,decode")
    p.add_argument("--losses", default=LOSSES, help="OPD losses; jsd:B sets beta B (default 0.5)")
    p.add_argument("--paths", default="distill,naive,liger,compile")
    p.add_argument("--ckpt", default="on", help="gradient checkpointing settings: on, off or on,off")
    p.add_argument("--chunks", default=None, help="extra distill chunk sizes (rows); default 220 (the CPU's)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--prompt", type=int, default=None)
    p.add_argument("--completion", type=int, default=None)
    p.add_argument("--topk", type=int, default=32)
    p.add_argument("--decode", default=None, help="rows,prompt,new (default 32,512,256)")
    p.add_argument("--iters", type=int, default=None, help="timed calls per path (default 3; smoke 1)")
    p.add_argument("--decode-iters", type=int, default=1, help="timed calls per decode path")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--row-timeout-s", type=float, default=240.0)
    p.add_argument("--budget-s", type=float, default=0.0, help="start no row after this many seconds")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak (default: by GPU name)")
    a = p.parse_args(argv)
    small = a.smoke
    a.iters = a.iters or (1 if small else 3)
    a.batch = a.batch or (2 if small else 8)
    a.prompt = a.prompt or (8 if small else 256)
    a.completion = a.completion or (24 if small else 4096)
    a.decode = [int(x) for x in (a.decode or ("2,8,6" if small else "32,512,256")).split(",")]
    chunks = a.chunks if a.chunks is not None else ("7" if small else "220")
    a.chunks = [int(c) for c in chunks.split(",") if c.strip()]
    a.device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bf16 = a.dtype == "bf16" or (a.dtype == "auto" and a.device.type == "cuda")
    a.torch_dtype = torch.bfloat16 if bf16 else torch.float32
    a.paths = set(a.paths.split(","))
    a.t0 = time.perf_counter()
    return a


# ------------------------------------------------------------------------------ measurement


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    """Hand a row's blocks back to the device (on the CPU refcounting has freed them already, and
    a collection over transformers' import graph costs ~0.5 s)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field))
    except (OSError, StopIteration):
        return None


def timed(step: paths.Step, device: torch.device) -> tuple[float, float | None, dict[str, torch.Tensor]]:
    """(ms, peak GiB added over what was allocated before the call, the step's outputs)."""
    sync(device)
    base: float | None
    if device.type == "cuda":
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:  # Linux: reset the RSS high-water mark to now
            Path("/proc/self/clear_refs").write_text("5")
            base = _rss_kib("VmRSS")
        except OSError:
            base = None
    start = time.perf_counter()
    out = step()
    sync(device)
    ms = (time.perf_counter() - start) * 1e3
    if device.type == "cuda":
        assert base is not None
        return ms, (torch.cuda.max_memory_allocated(device) - base) / hardware.GIB, out
    high = _rss_kib("VmHWM")
    return ms, None if base is None or high is None else (high - base) * 1024 / hardware.GIB, out


class RowTimeout(Exception):
    pass


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """RowTimeout once `seconds` pass (checked between Python bytecodes: a kernel in flight ends first)."""

    def expire(signum: int, frame: Any) -> None:
        raise RowTimeout(f"over the row timeout of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _failure(exc: BaseException) -> tuple[str, str]:
    line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if isinstance(exc, OOM) or "out of memory" in line.lower():
        return "OOM", line
    return ("timeout" if isinstance(exc, RowTimeout) else "error"), line


def interleaved(
    args: argparse.Namespace, steps: Paths, iters: int | None = None
) -> dict[str, dict[str, Any]]:
    """Each path once per round, `warmup` rounds then `iters` timed ones; a failing path drops out."""
    iters = args.iters if iters is None else iters
    res: dict[str, dict[str, Any]] = {
        n: {"times": [], "peaks": [], "status": "ok", "note": "", "out": {}} for n in steps
    }
    live = list(steps)
    try:
        with deadline(args.row_timeout_s):
            for round_ in range(args.warmup + iters):
                for name in list(live):
                    step, before = steps[name]
                    try:
                        if before is not None:
                            before()
                        ms, peak, out = timed(step, args.device)
                    except RowTimeout:
                        raise
                    except Exception as exc:  # noqa: BLE001 - one path's failure is its row's status
                        res[name]["status"], res[name]["note"] = _failure(exc)
                        if res[name]["status"] == "error":
                            res[name]["traceback"] = traceback.format_exc()[-2000:]
                        live.remove(name)
                    if name not in live:  # outside the handler: its traceback held the blocks
                        free(args.device)
                        continue
                    res[name]["out"] = {k: v.detach().float().cpu() for k, v in out.items() if v is not None}
                    out = {}
                    if round_ >= args.warmup:
                        res[name]["times"].append(ms)
                        res[name]["peaks"].append(peak)
    except RowTimeout as exc:
        for name in live:
            res[name]["status"], res[name]["note"] = _failure(exc)
    free(args.device)
    return res


def run_row(args: argparse.Namespace, report: gpu_report.Report, fields: dict[str, Any], steps: Paths,
            tokens: int, flops_per_token: float | None, skipped: dict[str, str] | None = None,
            iters: int | None = None) -> None:  # fmt: skip
    """Measure one row's paths and hand the results to the report (n/a paths as such)."""
    if args.budget_s and time.perf_counter() - args.t0 > args.budget_s:
        for name in [*steps, *(skipped or {})]:
            report.add({**fields, "path": name, "status": "skipped", "note": "time budget spent"})
        return
    print(f"[run ] {gpu_report.label(fields)}: {', '.join(steps)}", flush=True)
    results = interleaved(args, steps, iters)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else hardware.device_peak(args.device)
    report.add_group(fields, results, tokens, flops_per_token, peak)
    for name, why in (skipped or {}).items():
        report.add({**fields, "path": name, "status": "n/a", "note": why})


# ------------------------------------------------------------------------------ parts


def variants(args: argparse.Namespace, distill: Callable[[], paths.Step], compile_ok: bool = True) -> Paths:
    """distill at the device's default chunk, at each --chunks size, and compiled (CUDA)."""
    out: Paths = {}
    for rows in args.chunks:
        out[f"distill chunk={rows}"] = (_wrapped(distill(), rows, False), None)
    if "compile" in args.paths and args.device.type == "cuda" and compile_ok:
        out["distill+compile"] = (_wrapped(distill(), None, True), None)
    return out


def _wrapped(step: paths.Step, rows: int | None, compiled: bool) -> paths.Step:
    def run() -> dict[str, torch.Tensor]:
        with paths.variant(rows, compiled):
            return step()

    return run


def _na(args: argparse.Namespace, **why: str) -> dict[str, str]:
    """The paths of a row that cannot run here, and why."""
    skipped = {}
    if "compile" in args.paths and args.device.type != "cuda":
        skipped["distill+compile"] = "CUDA only"
    problem = paths.liger_problem(args.device)
    if "liger" in args.paths and (problem or "liger" in why):
        skipped["liger"] = why.get("liger") or str(problem)
    return skipped


def score_part(args: argparse.Namespace, report: gpu_report.Report) -> None:
    config = paths.qwen3_config("teacher", args.smoke)
    teacher = paths.build(config, args.device, args.torch_dtype).eval()
    report.meta["teacher"] = hardware.model_shape(teacher)
    engine = HFEngine(teacher, paths.IdsOnly(config.vocab_size))  # type: ignore[arg-type]
    b, p, t, k = args.batch, args.prompt, args.completion, args.topk
    batch = paths.make_batch(b, p, t, config.vocab_size, 8, k, args.device, args.torch_dtype)
    ids = batch.ids_B_L
    prompts, completions = ids[:, :p].tolist(), ids[:, p:].tolist()
    distill = lambda: paths.score_distill(engine, prompts, completions, k)  # noqa: E731
    steps: Paths = {"distill": (distill(), None)}
    if "naive" in args.paths:
        steps["naive"] = (paths.score_naive(teacher, ids, p, k), None)
    steps.update(variants(args, distill))
    # The engine's own split (SCORE_TOKENS per decoder pass: 7 + 1 rows at 8 x 4,352).
    steps["distill engine batches"] = (
        paths.score_distill(engine, prompts, completions, k, whole=False),
        None,
    )
    shape = report.meta["teacher"]
    fpt = hardware.flops_per_token(
        shape["params"], shape["layers"], shape["attn_width"], p + t, training=False
    )
    fields = {"part": "score", "model": "teacher", "shape": f"{b}x({p}+{t})", "loss": f"top-{k}", "ckpt": "-"}
    run_row(args, report, fields, steps, b * (p + t), fpt, _na(args, liger="Liger has no scoring kernel"))


def _loss_name(spec: str) -> tuple[str, float]:
    name, _, beta = spec.partition(":")
    return name, float(beta) if beta else 0.5


def _student_steps(
    args: argparse.Namespace, student: Any, batch: paths.Batch, loss: str, beta: float
) -> tuple[Paths, dict[str, str]]:
    """The row's paths (each a forward + backward from cleared gradients) and its n/a ones."""

    def compute(path: str) -> Callable[[], torch.Tensor]:
        if loss == "ce":
            return lambda: paths.ce_step(student, batch, path)
        func = {"distill": paths.loss_distill, "naive": paths.loss_naive, "liger": paths.loss_liger}[path]
        return lambda: func(student, batch, loss, beta)

    def clear() -> None:
        student.zero_grad(set_to_none=True)

    def distill() -> paths.Step:
        return paths.train_step(student, compute("distill"))

    steps: Paths = {"distill": (distill(), clear)}
    if "naive" in args.paths:
        steps["naive"] = (paths.train_step(student, compute("naive")), clear)
    no_liger = {"liger": "Liger-Kernel has no top-k forward KL"} if loss == "forward_kl_topk" else {}
    if "liger" in args.paths and not paths.liger_problem(args.device) and not no_liger:
        steps["liger"] = (paths.train_step(student, compute("liger")), clear)
    # The compiled candidate replaces heads.py's block arithmetic, which jsd (jsd.py) does not use.
    steps.update({n: (s, clear) for n, (s, _) in variants(args, distill, loss != "jsd").items()})
    return steps, _na(args, **no_liger)


def student_part(args: argparse.Namespace, report: gpu_report.Report, parts: set[str]) -> None:
    config = paths.qwen3_config("student", args.smoke)
    student = paths.build(config, args.device, args.torch_dtype).train()
    report.meta["student"] = shape = hardware.model_shape(student)
    teacher_hidden = paths.qwen3_config("teacher", args.smoke).hidden_size
    b, p, t = args.batch, args.prompt, args.completion
    vocab = config.vocab_size
    batch = paths.make_batch(b, p, t, vocab, teacher_hidden, args.topk, args.device, args.torch_dtype)
    fpt = hardware.flops_per_token(shape["params"], shape["layers"], shape["attn_width"], p + t)
    specs = [_loss_name(s) for s in args.losses.split(",") if s] if "opd" in parts else []
    if "ce" in parts:
        specs.append(("ce", 0.0))
    for ckpt in args.ckpt.split(","):
        if ckpt == "on":
            student.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            student.activation_checkpointing_disable()
        for loss, beta in specs:
            steps, skipped = _student_steps(args, student, batch, loss, beta)
            name = loss if loss != "jsd" else f"jsd(beta={beta:g})"
            part = "ce" if loss == "ce" else "opd"
            fields = {"part": part, "model": "student", "shape": f"{b}x({p}+{t})", "loss": name, "ckpt": ckpt}
            run_row(args, report, fields, steps, b * (p + t), fpt, skipped)
    student = None
    free(args.device)


def decode_part(args: argparse.Namespace, report: gpu_report.Report) -> None:
    config = paths.qwen3_config("student", args.smoke)
    student = paths.build(config, args.device, args.torch_dtype).eval()
    rows, prompt, new = args.decode
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, config.vocab_size, (rows, prompt), generator=gen)
    lean = HFEngine(student, paths.IdsOnly(config.vocab_size))  # type: ignore[arg-type]
    loop = HFEngine(student, paths.IdsOnly(config.vocab_size))  # type: ignore[arg-type]
    loop.lean_decode = False

    def batched(engine: HFEngine) -> paths.Step:
        def step() -> dict[str, torch.Tensor]:
            done = engine.continue_many(ids.tolist(), [None] * rows, Sampling(new))
            return {"tokens": torch.tensor([c.ids for c, _ in done])}

        return step

    def generate() -> dict[str, torch.Tensor]:
        with torch.inference_mode():
            out = student.generate(input_ids=ids.to(args.device), attention_mask=torch.ones_like(ids).to(args.device),
                                   max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)  # fmt: skip
        return {"tokens": out[:, prompt:]}

    steps: Paths = {"distill": (batched(lean), None), "distill model-call loop": (batched(loop), None),
                    "generate": (generate, None)}  # fmt: skip
    fields = {
        "part": "decode",
        "model": "student",
        "shape": f"{rows}x({prompt}+{new})",
        "loss": "greedy",
        "ckpt": "-",
    }
    run_row(args, report, fields, steps, rows * new, None, iters=args.decode_iters)
    student = None
    free(args.device)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.manual_seed(0)
    vocab = paths.qwen3_config("student", args.smoke).vocab_size
    meta = {
        "device": torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "dtype": str(args.torch_dtype).replace("torch.", ""), "vocab": vocab,
        "default_chunk_rows": default_chunk_rows(vocab, args.device),
        "peak_tflops": (args.peak_tflops or (hardware.device_peak(args.device) or math.nan) / 1e12),
        "argv": list(argv if argv is not None else sys.argv[1:]),
    }  # fmt: skip
    report = gpu_report.Report(args.out, meta)
    parts = set(args.parts.split(","))
    if "score" in parts:
        score_part(args, report)
        free(args.device)  # the teacher's weights, before the student's rows measure their peaks
    if parts & {"opd", "ce"}:
        student_part(args, report, parts)
        free(args.device)
    if "decode" in parts:
        decode_part(args, report)
    report.meta["total_s"] = round(time.perf_counter() - args.t0, 1)
    report.write()
    print(f"wrote {report.json_path} and {report.md_path} ({report.meta['total_s']} s)", flush=True)
    return {"meta": report.meta, "rows": report.rows}


if __name__ == "__main__":
    main()
