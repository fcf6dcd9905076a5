"""The transformers engine: chat rendering, batched generation and teacher scoring on one device.

This is the CPU default for student rollouts in eval and for teacher work (scoring the student's
tokens, writing teacher trajectories). Lengths are checked, never silently cut. The model sits on
the device `load` is given (engines/placement.py decides which); inputs follow it there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.config import Sampling
from distill.engines.base import ChatPrompts, Completion, KVCache, TokenScores, right_pad
from distill.engines.batched import continue_many
from distill.engines.context import ContextError, context_length, room
from distill.kernels.heads import (
    head_gather,
    head_gather_topk,
    head_module,
    head_shape,
    output_head,
    scatter_positions,
    select_positions,
)
from distill.kernels.sharded import (
    agreed_count,
    head_call,
    inference_forward,
    inference_sharded,
    local_shard,
)
from distill.kernels.states import completion_states
from distill.progress import hf_bars_off

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Tokens (rows x width) per scoring pass: the decoder's [rows, tokens, hidden] states are its
# working set, so long rows go a few at a time and the short rows of the embedded default at once.
SCORE_TOKENS = 32_768


def _sampling(sampling: Sampling) -> dict[str, Any]:
    """`generate`'s sampling arguments (top-k off: only temperature and nucleus, as every sampler)."""
    if sampling.temperature > 0:
        return {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
    return {"do_sample": False}


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer at `path`, its EOS as the pad token where it has none."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def budget_groups(lengths: Sequence[int], context: int | None, budget: int) -> list[tuple[int, list[int]]]:
    """The rows of a generation call grouped by the new tokens each may have (the context
    policy, engines/context.py, per prompt): the rows with room for the whole `budget` in one
    group, in order, then each shorter room with the rows of its length. Left-padded together,
    a group's prompts and its budget fit the context, and no row is capped by a batch-mate's
    length. ContextError for a prompt that leaves no room at all."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        allowed = room(context, n, budget)
        if allowed < 1:
            raise ContextError(f"a prompt of {n} tokens fills the model's {context} positions")
        groups.setdefault(allowed, []).append(i)
    return sorted(groups.items(), key=lambda group: -group[0])


class HFEngine(ChatPrompts):
    """A transformers model in this process (the `Engine` protocol)."""

    supports_cache = True

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        enable_thinking: bool | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self._prompt_cache = {}
        # continue_many's decode steps through engines/decode.py where the model's family allows
        # (~2x fewer seconds per step on the embedded models); False: the transformers call.
        self.lean_decode = True
        if tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer of {model.name_or_path!r} has no pad token")

    @classmethod
    def load(
        cls, path: str, precision: str = "fp32", enable_thinking: bool | None = None, device: str = "cpu"
    ) -> HFEngine:
        """The model and tokenizer at `path`, in `precision`, on `device` (a torch device string:
        engines/placement.py decides it from the config's `device` field)."""
        import torch
        from transformers import AutoModelForCausalLM

        tokenizer = load_tokenizer(path)
        dtype = getattr(torch, DTYPES[precision])
        with hf_bars_off():
            if (Path(path) / "adapter_config.json").exists():
                # A LoRA checkpoint (lora.enabled): base weights + adapters, merged for plain inference.
                from peft import AutoPeftModelForCausalLM

                model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype).merge_and_unload()
            else:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        if torch.device(device) != model.device:
            model.to(device)
        model.eval()
        return cls(model, tokenizer, enable_thinking)

    @property
    def context(self) -> int | None:
        """The positions the model was built for (prompt + response must fit in them)."""
        return context_length(self.model)

    def describe(self) -> dict[str, Any]:
        model = self.model
        return {
            "engine": "hf",
            "path": str(model.name_or_path),
            "class": type(model).__name__,
            # ZeRO-3 leaves a parameter 0 elements outside its forward (its `ds_numel` is whole).
            "params": sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters()),
            # This process's bytes of them: its shard where they are split over the ranks.
            "param_bytes": sum(local_shard(p).numel() * p.element_size() for p in model.parameters()),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "vocab": len(self.tokenizer),
            # Where the weights are when asked (the manifest's `models.<role>.device`).
            "device": str(next(model.parameters()).device),
        }

    @property
    def eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(gen_eos)
        return {i for i in ids if i is not None}

    def left_pad(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            if row:
                ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
                mask[i, width - len(row) :] = 1
        return ids, mask

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        sampling: Sampling,
        batch_size: int = 64,
        progress: Callable[[int], None] | None = None,
        suppress_tokens: Sequence[int] = (),
    ) -> list[Completion]:
        """One completion per prompt row (repeat rows for k samples), drawn as `sampling` says
        (greedy at temperature 0). Each prompt may have the new tokens its own length leaves in
        the context (`budget_groups`), whatever its batch-mates' lengths. `suppress_tokens` are
        never generated (on top of the model's own generation config).
        """
        import torch

        eos = self.eos_ids
        suppress: dict[str, Any] = {}
        if suppress_tokens:
            before = self.model.generation_config.suppress_tokens or []
            suppress["suppress_tokens"] = sorted(set(before) | set(suppress_tokens))

        out: list[Completion | None] = [None] * len(prompt_ids)
        lengths = [len(p) for p in prompt_ids]
        for budget, rows in budget_groups(lengths, self.context, sampling.max_new_tokens):
            for start in range(0, len(rows), batch_size):
                chunk = rows[start : start + batch_size]
                ids, mask = self.left_pad([prompt_ids[i] for i in chunk])
                with torch.inference_mode():
                    generated = self.model.generate(  # type: ignore[operator]  # transformers types generate() as a Tensor | Module attribute
                        input_ids=ids.to(self.model.device),
                        attention_mask=mask.to(self.model.device),
                        max_new_tokens=budget,
                        pad_token_id=self.tokenizer.pad_token_id,
                        eos_token_id=sorted(eos),
                        # A model is whole when it generates (a sharded student is gathered
                        # first: kernels/sharded.py), and rank 0 evaluates alone: transformers'
                        # per-token sync over the processes under FSDP / ZeRO-3 would wait forever.
                        synced_gpus=False,
                        **_sampling(sampling),
                        **suppress,
                    )
                for i, row in zip(chunk, generated[:, ids.shape[1] :].tolist(), strict=True):
                    out[i] = self.completion(row, eos)
                if progress is not None:
                    progress(len(chunk))
        return [c for c in out if c is not None]

    def continue_generate(
        self, ids: Sequence[int], cache: KVCache | None, sampling: Sampling
    ) -> tuple[Completion, KVCache]:
        """One completion of `ids`, reusing `cache` where it holds a prefix of `ids`.

        A multi-turn episode grows by one observation a turn: with the cache of its last turn
        only the new tokens are prefilled instead of the whole 1-3k-token context. Returns the
        cache to pass with the episode's next, longer sequence.
        """
        import torch

        ids = list(ids)
        budget = room(self.context, len(ids), sampling.max_new_tokens)
        if budget < 1:  # the context is full: the turn is cut before it starts, and counts as truncated
            return Completion(ids=[], text="", truncated=True), cache or KVCache(None, [])
        past = None
        if cache is not None and len(cache.ids) < len(ids) and ids[: len(cache.ids)] == cache.ids:
            past = cache.past
        eos = self.eos_ids
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        with torch.inference_mode():
            out = self.model.generate(  # type: ignore[operator]  # transformers types generate() as a Tensor | Module attribute
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                cache=past,
                max_new_tokens=budget,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=sorted(eos),
                synced_gpus=False,  # whole weights, never a sharded forward (`generate` above)
                return_dict_in_generate=True,
                **_sampling(sampling),
            )
        row = out.sequences[0, len(ids) :].tolist()
        # The last generated token is never fed back, so the cache ends one token short.
        seen = ids + row
        return self.completion(row, eos), KVCache(out.cache, seen[: out.cache.get_seq_length()])

    def continue_many(
        self, rows: Sequence[Sequence[int]], caches: Sequence[KVCache | None], sampling: Sampling
    ) -> list[tuple[Completion, KVCache]]:
        """`continue_generate` for many sequences in one batch, each from its own cache
        (engines/batched.py); rows whose context is full come back empty and truncated."""
        budgets = [room(self.context, len(ids), sampling.max_new_tokens) for ids in rows]
        results: list[tuple[Completion, KVCache] | None] = [
            None if b >= 1 else (Completion(ids=[], text="", truncated=True), c or KVCache(None, []))
            for b, c in zip(budgets, caches, strict=True)
        ]
        live = [i for i, r in enumerate(results) if r is None]
        if live:
            batch = continue_many(
                self,
                [rows[i] for i in live],
                [caches[i] for i in live],
                [budgets[i] for i in live],
                sampling,
            )
            if batch is None:  # a cache kind that cannot be stacked: one row at a time
                batch = [self.continue_generate(rows[i], caches[i], sampling) for i in live]
            for i, result in zip(live, batch, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        batch_size: int | None = None,
        top_k: int = 0,
        states: bool = False,
    ) -> TokenScores:
        """Log-probability of every completion token given its prompt (and, with `top_k`, the
        model's top-k there; with `states`, its final hidden states there), right-padded [B, T]
        tensors on the model's device: hidden states once, the head applied per chunk of
        positions (kernels/heads.py), never [B, T, vocab]. A model sharded for inference
        (kernels/sharded.py) runs as many passes as the rank with the most, in step with them."""
        import torch

        comp_B_T, mask_B_T = self._completions(prompt_ids, completion_ids)
        device = self.model.device
        logprobs_B_T = torch.zeros(comp_B_T.shape, dtype=torch.float32, device=device)
        top_ids = torch.zeros((*comp_B_T.shape, top_k), dtype=torch.long, device=device)
        top_logps = torch.zeros((*comp_B_T.shape, top_k), dtype=torch.float32, device=device)
        # The head module's sizes: a ZeRO-3 teacher's weight holds none of its rows here.
        hidden_size, dtype = head_shape(self.model)[1], head_module(self.model).weight.dtype
        states_B_T_H = (
            torch.zeros((*comp_B_T.shape, hidden_size), dtype=dtype, device=device) if states else None
        )
        chunks = self._chunks(prompt_ids, comp_B_T, batch_size)
        # Scores are data, never part of a graph: a gradient through them would reach the head
        # (an advantage built from the student's scores would pull on the student's weights).
        with torch.no_grad():
            for i in range(agreed_count(self.model, len(chunks))):
                if i >= len(chunks):  # another rank's pass: a throwaway one, run in step with it
                    inference_forward(
                        self.model, self._pass, prompt_ids, comp_B_T, mask_B_T, slice(0, 1), 0, False
                    )
                    continue
                rows = chunks[i]
                hidden_b_T_H, gathered_N_1, lse_N, ids_N_K, logps_N_K = inference_forward(
                    self.model, self._pass, prompt_ids, comp_B_T, mask_B_T, rows, top_k, states
                )
                mask_b_T = mask_B_T[rows]
                if states_B_T_H is not None and hidden_b_T_H is not None:
                    states_B_T_H[rows] = hidden_b_T_H
                if ids_N_K is not None and logps_N_K is not None:
                    top_ids[rows] = scatter_positions(ids_N_K, mask_b_T, fill=0)
                    top_logps[rows] = scatter_positions(logps_N_K, mask_b_T)
                logprobs_B_T[rows] = scatter_positions(gathered_N_1[:, 0] - lse_N, mask_b_T)
        scores = TokenScores(
            logprobs_B_T,
            mask_B_T.bool(),
            top_ids if top_k else None,
            top_logps if top_k else None,
            states_B_T_H,
        )
        scores.check(completion_ids, "scored")
        return scores

    def score_topk(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        k: int,
        batch_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's top-k ids and logprobs at each completion position, [B, T_max, k]; positions
        past a row's length hold id 0, logprob 0."""
        return self.score(prompt_ids, completion_ids, batch_size, top_k=k).topk()

    def _completions(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Completions right-padded on the model's device; prompts and completions must pair up."""
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"score: {len(prompt_ids)} prompts but {len(completion_ids)} completions")
        for i, prompt in enumerate(prompt_ids):
            if not prompt and completion_ids[i]:
                raise ValueError(f"score: row {i} has an empty prompt")
        comp_B_T, mask_B_T = right_pad(completion_ids, int(self.tokenizer.pad_token_id))
        return comp_B_T.to(self.model.device), mask_B_T.to(self.model.device)

    def _chunks(
        self, prompt_ids: Sequence[Sequence[int]], comp_B_T: torch.Tensor, batch_size: int | None
    ) -> list[slice]:
        """The rows of each scoring pass: `batch_size` at a time, or as many as SCORE_TOKENS hold."""
        width = max((len(p) for p in prompt_ids), default=0) + comp_B_T.shape[1]
        size = batch_size or max(1, SCORE_TOKENS // max(width, 1))
        return [slice(start, start + size) for start in range(0, len(prompt_ids), size)]

    def _pass(
        self,
        prompt_ids: Sequence[Sequence[int]],
        comp_B_T: torch.Tensor,
        mask_B_T: torch.Tensor,
        rows: slice,
        top_k: int,
        states: bool,
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One scoring pass over `rows`: with `states` their hidden states at the completion
        positions, and from the head the targets' logits and each position's logsumexp (and
        top-k), [N, ...] over the positions the mask keeps."""
        prompt_b_P, prompt_mask_b_P = self.left_pad(prompt_ids[rows])
        device = self.model.device
        hidden_b_T_H = completion_states(
            self.model, prompt_b_P.to(device), prompt_mask_b_P.to(device), comp_B_T[rows], mask_B_T[rows]
        )
        mask_b_T = mask_B_T[rows]
        targets_N_1 = select_positions(comp_B_T[rows], mask_b_T)[:, None]

        def passes(hidden_N_H: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
            if top_k:
                return head_gather_topk(hidden_N_H, weight, bias, targets_N_1, top_k)
            return (*head_gather(hidden_N_H, weight, bias, targets_N_1), None, None)

        hidden_N_H = select_positions(hidden_b_T_H, mask_b_T)
        kept_b_T_H = hidden_b_T_H if states else None
        if not inference_sharded(self.model):
            return kept_b_T_H, *passes(hidden_N_H, *output_head(self.model))
        # The head gathered for the pass (kernels/sharded.py); a copy of the states, not a view of
        # the decoder's output, leaves the forward's hooks (a view would lose them).
        kept_b_T_H = None if kept_b_T_H is None else kept_b_T_H.clone()
        return kept_b_T_H, *head_call(self.model, passes, hidden_N_H)
