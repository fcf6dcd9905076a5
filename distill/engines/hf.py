"""The transformers engine: chat rendering, batched generation and teacher scoring on one device.

This is the CPU default for student rollouts in eval and for teacher work (scoring the student's
tokens, writing teacher trajectories). Lengths are checked, never silently cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.engines.base import ChatPrompts, Completion, KVCache

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _sampling(temperature: float, top_p: float) -> dict[str, Any]:
    if temperature > 0:
        return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    return {"do_sample": False}


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
        if tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer of {model.name_or_path!r} has no pad token")

    @classmethod
    def load(cls, path: str, precision: str = "fp32", enable_thinking: bool | None = None) -> HFEngine:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from distill.progress import hf_bars_off

        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        dtype = getattr(torch, DTYPES[precision])
        with hf_bars_off():
            if (Path(path) / "adapter_config.json").exists():
                # A LoRA checkpoint (lora.enabled): base weights + adapters, merged for plain inference.
                from peft import AutoPeftModelForCausalLM

                model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype).merge_and_unload()
            else:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        model.eval()
        return cls(model, tokenizer, enable_thinking)

    def describe(self) -> dict[str, Any]:
        model = self.model
        return {
            "engine": "hf",
            "path": str(model.name_or_path),
            "class": type(model).__name__,
            "params": sum(p.numel() for p in model.parameters()),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "vocab": len(self.tokenizer),
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
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        batch_size: int = 64,
        progress: Callable[[int], None] | None = None,
        suppress_tokens: Sequence[int] = (),
    ) -> list[Completion]:
        """One completion per prompt row (repeat rows for k samples). temperature 0 is greedy.

        `suppress_tokens` are never generated (on top of the model's own generation config).
        """
        import torch

        eos = self.eos_ids
        suppress: dict[str, Any] = {}
        if suppress_tokens:
            before = self.model.generation_config.suppress_tokens or []
            suppress["suppress_tokens"] = sorted(set(before) | set(suppress_tokens))
        out: list[Completion] = []
        for start in range(0, len(prompt_ids), batch_size):
            chunk = prompt_ids[start : start + batch_size]
            ids, mask = self.left_pad(chunk)
            with torch.inference_mode():
                generated = self.model.generate(  # type: ignore[operator]  # transformers types generate() as a Tensor | Module attribute
                    input_ids=ids.to(self.model.device),
                    attention_mask=mask.to(self.model.device),
                    max_new_tokens=max_new_tokens,
                    pad_token_id=self.tokenizer.pad_token_id,
                    eos_token_id=sorted(eos),
                    **_sampling(temperature, top_p),
                    **suppress,
                )
            out += [self.completion(row, eos) for row in generated[:, ids.shape[1] :].tolist()]
            if progress is not None:
                progress(len(chunk))
        return out

    def continue_generate(
        self,
        ids: Sequence[int],
        cache: KVCache | None,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
    ) -> tuple[Completion, KVCache]:
        """One completion of `ids`, reusing `cache` where it holds a prefix of `ids`.

        A multi-turn episode grows by one observation a turn: with the cache of its last turn
        only the new tokens are prefilled instead of the whole 1-3k-token context. Returns the
        cache to pass with the episode's next, longer sequence.
        """
        import torch

        ids = list(ids)
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
                max_new_tokens=max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=sorted(eos),
                return_dict_in_generate=True,
                **_sampling(temperature, top_p),
            )
        row = out.sequences[0, len(ids) :].tolist()
        # The last generated token is never fed back, so the cache ends one token short.
        seen = ids + row
        return self.completion(row, eos), KVCache(out.cache, seen[: out.cache.get_seq_length()])

    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        batch_size: int = 64,
        top_k: int = 0,
    ) -> list[list[float]]:
        """Log-probability of each completion token given its prompt and the tokens before it.

        Returns one list per row with exactly `len(completion_ids[i])` entries.
        """
        import torch

        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"score: {len(prompt_ids)} prompts but {len(completion_ids)} completions")
        results: list[list[float]] = []
        for start in range(0, len(prompt_ids), batch_size):
            prompts = prompt_ids[start : start + batch_size]
            comps = completion_ids[start : start + batch_size]
            rows = [list(p) + list(c) for p, c in zip(prompts, comps, strict=True)]
            ids, mask = self.left_pad(rows)
            ids, mask = ids.to(self.model.device), mask.to(self.model.device)
            with torch.inference_mode():
                logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
            logprobs_B_T = torch.log_softmax(logits[:, :-1], dim=-1)
            targets_B_T = ids[:, 1:]
            token_lp_B_T = logprobs_B_T.gather(-1, targets_B_T.unsqueeze(-1)).squeeze(-1)
            width = ids.shape[1]
            for i, comp in enumerate(comps):
                n = len(comp)
                # Position t predicts token t+1: the completion occupies the last n targets.
                row = token_lp_B_T[i, width - 1 - n :].tolist() if n else []
                if len(row) != n:
                    raise ValueError(
                        f"score: row {start + i} has {n} completion tokens but {len(row)} logprobs"
                    )
                results.append(row)
        return results

    def score_topk(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        k: int,
        batch_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's top-k ids and logprobs at each completion position, [B, T_max, k].

        Prompts left-padded, completions right-padded to the longest row (the trainer's layout), so
        the completion starts at one column; positions past a row's length hold id 0, logprob 0.
        """
        import torch

        from distill.engines.states import completion_states

        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"score_topk: {len(prompt_ids)} prompts but {len(completion_ids)} completions")
        width = max((len(c) for c in completion_ids), default=0)
        pad = self.tokenizer.pad_token_id
        comp_B_T = torch.full((len(completion_ids), width), pad, dtype=torch.long)
        mask_B_T = torch.zeros((len(completion_ids), width), dtype=torch.long)
        for i, row in enumerate(completion_ids):
            comp_B_T[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
            mask_B_T[i, : len(row)] = 1
        prompt_B_P, prompt_mask_B_P = self.left_pad(prompt_ids)
        device = self.model.device
        # no_grad, not inference_mode: the trainer's loss saves these tensors for backward.
        with torch.no_grad():
            hidden_B_T_H = completion_states(
                self.model,
                prompt_B_P.to(device),
                prompt_mask_B_P.to(device),
                comp_B_T.to(device),
                mask_B_T.to(device),
            )
            head = self.model.get_output_embeddings()
            top = torch.log_softmax(head(hidden_B_T_H).float(), dim=-1).topk(k, dim=-1)
        keep_B_T_1 = mask_B_T.to(device).bool().unsqueeze(-1)
        return top.indices * keep_B_T_1, top.values * keep_B_T_1
