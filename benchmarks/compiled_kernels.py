"""The chunk kernels compiled (`kernels.compile=on`) against eager, side by side in one process.

For each vocabulary size: the chunked head's forward (`head_gather_topk`, top-8) and `chunked_jsd`
forward + backward, eager and compiled interleaved call by call, the row count moving a little
from call to call as a run's steps do (it stays inside the shape buckets: nothing recompiles).
Prints the medians after warm-up, their ratio, the largest differences of the outputs, and the
graphs compiled. A run's step adds generation, the teacher and the optimizer around these
kernels: `benchmarks/opd_step.py --systems distill:jsd,distill:jsd:compiled` measures that.

    python benchmarks/compiled_kernels.py                      # V = 151,936 and 1,024
    python benchmarks/compiled_kernels.py --vocab 151936 --rounds 12
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from distill.kernels import compiled
from distill.kernels.heads import head_gather_topk
from distill.kernels.jsd import chunked_jsd

MODES = ("off", "on")


def _timed(rounds: int, warmup: int, call: Callable[[int], None]) -> dict[str, float]:
    """Median seconds per mode, the modes interleaved within every round."""
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for i in range(rounds):
        for mode in MODES:
            compiled.set_mode(mode)
            start = time.perf_counter()
            call(i)
            times[mode].append(time.perf_counter() - start)
    return {mode: statistics.median(values[warmup:]) for mode, values in times.items()}


def head_case(vocab: int, hidden: int, rows: int, rounds: int, warmup: int) -> str:
    weight = torch.randn(vocab, hidden) * 0.05
    hidden_N_H = torch.randn(rows, hidden)
    ids_N_1 = torch.randint(0, vocab, (rows, 1))
    outs = {}
    for mode in MODES:
        compiled.set_mode(mode)
        outs[mode] = head_gather_topk(hidden_N_H, weight, None, ids_N_1, 8)
    (g0, l0, i0, top0), (g1, l1, i1, top1) = outs["off"], outs["on"]
    lse_rel = float(((l0 - l1).abs() / l0.abs()).max())
    same_ids = torch.equal(i0, i1)

    def call(i: int) -> None:
        n = rows - (i * 7) % 50
        head_gather_topk(hidden_N_H[:n], weight, None, ids_N_1[:n], 8)

    med = _timed(rounds, warmup, call)
    return (
        f"| head forward (top-8) | {vocab:,} | {rows} | {med['off'] * 1e3:.1f} | {med['on'] * 1e3:.1f} | "
        f"{med['on'] / med['off']:.2f} | lse rel {lse_rel:.1e}, top-k ids equal: {same_ids}, "
        f"logits at ids max diff {float((g0 - g1).abs().max()):.1e}, top-k logprobs {float((top0 - top1).abs().max()):.1e} |"
    )


def jsd_case(vocab: int, hidden: int, rows: int, rounds: int, warmup: int) -> str:
    ws = (torch.randn(vocab, hidden) * 0.05).requires_grad_()
    wt = torch.randn(vocab, hidden) * 0.05
    hs = torch.randn(rows, hidden, requires_grad=True)
    ht = torch.randn(rows, hidden)
    worst = {"loss": 0.0, "grad": 0.0}
    for beta in (0.0, 0.5, 1.0):
        out = {}
        for mode in MODES:
            compiled.set_mode(mode)
            ws.grad = hs.grad = None
            loss = chunked_jsd(hs, ht, (ws, None), (wt, None), beta)
            loss.backward()
            assert hs.grad is not None and ws.grad is not None
            out[mode] = (float(loss.detach()), hs.grad.clone(), ws.grad.clone())
        worst["loss"] = max(worst["loss"], abs(out["off"][0] - out["on"][0]))
        for k in (1, 2):
            rel = float((out["on"][k] - out["off"][k]).abs().max() / out["off"][k].abs().max())
            worst["grad"] = max(worst["grad"], rel)

    def call(i: int) -> None:
        n = rows - i * 3
        ws.grad = hs.grad = None
        chunked_jsd(hs[:n], ht[:n], (ws, None), (wt, None), 0.5).backward()

    med = _timed(rounds, warmup, call)
    return (
        f"| jsd forward + backward | {vocab:,} | {rows} | {med['off'] * 1e3:.1f} | {med['on'] * 1e3:.1f} | "
        f"{med['on'] / med['off']:.2f} | loss max diff {worst['loss']:.1e}, gradients {worst['grad']:.1e} "
        "of their max (beta 0, 0.5, 1) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", default="151936,1024", help="comma list of vocabulary sizes")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    print("| kernel | V | rows | eager ms | compiled ms | compiled / eager | equality |")
    print("|---|---|---|---|---|---|---|")
    for vocab in (int(v) for v in args.vocab.split(",")):
        rows = 700 if vocab > 50_000 else 3000  # about 1e8 logits a call either way
        print(head_case(vocab, 128, rows, args.rounds, args.warmup), flush=True)
        print(jsd_case(vocab, 64, rows // 2, args.rounds, args.warmup), flush=True)
    print(f"graphs compiled: {compiled.compiled_graphs()}")


if __name__ == "__main__":
    main()
