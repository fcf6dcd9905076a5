"""The lean decode step (engines/decode.py): the same logits, tokens and caches as the transformers
model call it replaces, on each family it takes; every other model keeps the model call."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import (
    AutoTokenizer,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
)

from distill.config import Sampling
from distill.engines.decode import DecodeState, lean_decoder
from distill.engines.hf import HFEngine


def _qwen2_with_bias(tokenizer: Any) -> HFEngine:
    """qwen2: q/k/v projections with biases and no per-head norms (random weights)."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
    )  # fmt: skip
    return HFEngine(_with_biases(Qwen2ForCausalLM(config).eval()), tokenizer)


def _llama_with_biases(tokenizer: Any) -> HFEngine:
    """llama with `attention_bias` and `mlp_bias`: biases on every projection (random weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
        attention_bias=True, mlp_bias=True,
    )  # fmt: skip
    return HFEngine(_with_biases(LlamaForCausalLM(config).eval()), tokenizer)


def _with_biases(model: Any) -> Any:
    """transformers initialises biases at zero: make them count."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
    return model


@pytest.fixture(scope="module")
def engines(tiny_zoo: Any) -> dict[str, HFEngine]:
    return {
        "qwen3": HFEngine.load(str(tiny_zoo.teacher)),
        "llama": HFEngine.load(str(tiny_zoo.teacher_llama)),
        "qwen2": _qwen2_with_bias(AutoTokenizer.from_pretrained(str(tiny_zoo.tok_qwen))),
        "llama-biases": _llama_with_biases(AutoTokenizer.from_pretrained(str(tiny_zoo.tok_llama))),
    }


def _two_turns(engine: HFEngine, lean: bool) -> list[list[Any]]:
    """Two turns of four episodes of different lengths, the second from the first's caches."""
    engine.lean_decode = lean
    texts = ["Sort: 3 1 2", "Add 2 and 5, then double it.", "Hi", "Count the vowels in 'banana' please."]
    rows = [engine.prompt_ids(t) for t in texts]
    first = engine.continue_many(rows, [None] * 4, Sampling(12))
    rows = [
        r + c.ids + engine.encode(f"\nObservation: {i} ok.\n")
        for i, (r, (c, _)) in enumerate(zip(rows, first, strict=True))
    ]
    second = engine.continue_many(rows, [k for _, k in first], Sampling(10))
    engine.lean_decode = True
    return [first, second]


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2", "llama-biases"])
def test_lean_steps_give_the_model_calls_tokens_and_caches(engines: dict[str, HFEngine], family: str) -> None:
    engine = engines[family]
    assert lean_decoder(engine.model) is not None
    for lean_turn, call_turn in zip(_two_turns(engine, True), _two_turns(engine, False), strict=True):
        for (c1, k1), (c2, k2) in zip(lean_turn, call_turn, strict=True):
            assert c1.ids == c2.ids and c1.truncated == c2.truncated
            assert k1.ids == k2.ids
            for a, b in zip(k1.past.layers, k2.past.layers, strict=True):
                torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=0)
                torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=0)


def test_a_lean_step_gives_the_model_calls_logits(engines: dict[str, HFEngine]) -> None:
    """One step on padded rows: the masked pad columns and per-row positions as continue_many sets them."""
    from transformers import DynamicCache

    model = engines["qwen3"].model
    torch.manual_seed(1)
    ids_B_S = torch.randint(5, model.config.vocab_size, (3, 7))
    mask_B_L = torch.ones((3, 7), dtype=torch.long)
    mask_B_L[0, :3] = 0  # row 0 is shorter: left-padded
    pos_B_S = (mask_B_L.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(input_ids=ids_B_S, attention_mask=mask_B_L, position_ids=pos_B_S, cache=DynamicCache())
        state = DecodeState(model, out.cache, mask_B_L, extra=4)
        feed_B = torch.tensor([True, False, True])  # row 1 has finished: it feeds a masked pad
        next_B, pos_B = torch.tensor([11, 0, 42]), pos_B_S[:, -1] + 1
        lean_B_V = state.step(next_B, pos_B, feed_B)
        mask_B_L = torch.cat([mask_B_L, feed_B.long()[:, None]], dim=1)
        call = model(
            input_ids=next_B[:, None], attention_mask=mask_B_L, position_ids=pos_B[:, None], cache=out.cache
        )
    torch.testing.assert_close(lean_B_V[[0, 2]], call.logits[[0, 2], -1], atol=1e-5, rtol=1e-5)
    assert torch.equal(state.mask(), mask_B_L)


def test_other_models_keep_the_model_call(tiny_zoo: Any) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_zoo.tok_qwen))
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=128, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(**common)).eval()
    assert lean_decoder(mistral) is None
    from transformers import Qwen3ForCausalLM

    windowed = Qwen3ForCausalLM(
        Qwen3Config(**common, head_dim=32, use_sliding_window=True, sliding_window=16)
    )
    assert lean_decoder(windowed) is None
    # LoRA projections keep their delta beside `.weight`: stepped lean, it would be lost.
    from peft import LoraConfig, get_peft_model

    plain = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=32))
    assert lean_decoder(plain) is not None
    lora = get_peft_model(plain, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert lean_decoder(lora.base_model.model) is None
    # The model call still continues the rows, as one at a time would.
    engine = HFEngine(mistral, tokenizer)
    rows = [engine.prompt_ids(t) for t in ("Sort: 3 1 2", "Hi")]
    together = engine.continue_many(rows, [None, None], Sampling(6))
    alone = [engine.continue_generate(r, None, Sampling(6)) for r in rows]
    assert [c.ids for c, _ in together] == [c.ids for c, _ in alone]
