"""Two tokenizer families trained locally, so cross-family paths have a real pair to work on.

`qwen`: byte-level BPE with single-digit splitting and Qwen's ChatML template (`<|im_start|>`,
`<|im_end|>`, `<think>`). `llama`: byte-level BPE that groups up to three digits (as Llama 3
does), a different vocabulary size and Llama 3's header template (`<|start_header_id|>`,
`<|eot_id|>`). Both are lossless on any unicode text (byte-level).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Family:
    name: str
    specials: tuple[str, ...]
    eos: str
    pad: str
    bos: str | None
    chat_template: str
    digits: str  # "single" | "triple"


# enable_thinking=false writes an empty think block, as Qwen3's template does.
QWEN_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)

LLAMA_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{%- for m in messages -%}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif -%}"
)

FAMILIES: dict[str, Family] = {
    "qwen": Family(
        name="qwen",
        specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        chat_template=QWEN_TEMPLATE,
        digits="single",
    ),
    "llama": Family(
        name="llama",
        specials=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<think>",
            "</think>",
        ),
        eos="<|eot_id|>",
        pad="<|end_of_text|>",
        bos="<|begin_of_text|>",
        chat_template=LLAMA_TEMPLATE,
        digits="triple",
    ),
}

# Printable ASCII and a little unicode, so every family has merges beyond the domain's words.
_BASE_TEXT = (
    "".join(chr(c) for c in range(32, 127))
    + " The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } \\boxed{}"
)


def train_tokenizer(family: str, texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE of `family` on `texts` and wrap it as a transformers tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    digit_split = (
        pre_tokenizers.Digits(individual_digits=True)
        if spec.digits == "single"
        else pre_tokenizers.Split(Regex(r"\d{1,3}"), behavior="isolated")
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [digit_split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(spec.specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_BASE_TEXT, *texts], trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=spec.eos,
        pad_token=spec.pad,
        bos_token=spec.bos,
        chat_template=spec.chat_template,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
        # Generation pads on the left; saved with the tokenizer so every loader agrees.
        padding_side="left",
    )
    hf.init_kwargs["distill_family"] = spec.name
    return hf
