"""The bridge on the two real locally trained tokenizer families (tok-qwen, tok-llama)."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from distill.tokenizer_bridge.bridge import (
    TokenizerBridge,
    clean_cut,
    encode_plain,
    flat,
    readable,
    trim_partial,
)
from distill.tokenizer_bridge.seam import check_pair, cut_points, hard_texts

TEXTS = [
    "naïve café — 世界 🙂 👩\u200d👩\u200d👧 e\u0301",
    "tabs\tand   spaces\n\n\n  indented\r\n",
    "digits 0 12 345 6789 1234567890 3.14159 -42",
    "multiplication multiplies multiplicatively",
]


@pytest.fixture(scope="module")
def qwen(tiny_zoo: Any) -> Any:
    return AutoTokenizer.from_pretrained(tiny_zoo.tok_qwen)


@pytest.fixture(scope="module")
def llama(tiny_zoo: Any) -> Any:
    return AutoTokenizer.from_pretrained(tiny_zoo.tok_llama)


def test_the_two_families_really_differ(qwen: Any, llama: Any) -> None:
    assert not TokenizerBridge(qwen, llama).same
    assert TokenizerBridge(qwen, qwen).same
    assert len(qwen) != len(llama) and qwen.eos_token != llama.eos_token
    digits = "1234567"
    # Qwen splits digits one by one, Llama pre-splits groups of three: seams fall at different places.
    assert len(qwen(digits, add_special_tokens=False)["input_ids"]) == 7
    assert len(llama(digits, add_special_tokens=False)["input_ids"]) < 7


@pytest.mark.parametrize("direction", ["qwen->llama", "llama->qwen"])
def test_every_seam_of_hard_texts_round_trips(qwen: Any, llama: Any, direction: str) -> None:
    student, teacher = (qwen, llama) if direction == "qwen->llama" else (llama, qwen)
    report = check_pair(student, teacher, TEXTS + hard_texts(student), cuts=None)
    assert report.ok, [(row.name, row.failures[:2]) for row in report.rows if not row.ok]
    seams = {row.name: row.cases for row in report.rows}
    # Every token boundary of every text was a seam (cut_points(n, None) = n + 1 cuts).
    assert seams["seam (student side)"] > 200
    assert 0.5 < report.ratio < 2.0


def test_prefix_and_continuation_cross_unchanged_at_every_cut(qwen: Any, llama: Any) -> None:
    bridge = TokenizerBridge(qwen, llama)
    for text in TEXTS:
        ids = list(qwen(text, add_special_tokens=False)["input_ids"])
        for k in cut_points(len(ids), None):
            k = clean_cut(qwen, ids, k)
            prefix = bridge.to_teacher(ids[:k])
            assert prefix.lossless
            assert llama.decode(prefix.ids) == qwen.decode(ids[:k])
            rest = encode_plain(llama, text[len(qwen.decode(ids[:k])) :])
            back = bridge.to_student(rest)
            assert qwen.decode(ids[:k] + back.ids) == text


def test_a_cut_inside_a_character_moves_back_to_its_start(qwen: Any, llama: Any) -> None:
    text = "ab世界"
    ids = list(qwen(text, add_special_tokens=False)["input_ids"])
    inside = next(k for k in range(1, len(ids)) if qwen.decode(ids[:k]).endswith("\ufffd"))
    # Crossing as is would turn half a character into a real U+FFFD on the teacher's side.
    naive = TokenizerBridge(qwen, llama).to_teacher(ids[:inside])
    assert "\ufffd" in llama.decode(naive.ids)
    k = clean_cut(qwen, ids, inside)
    assert k < inside and text.startswith(qwen.decode(ids[:k]))
    assert "\ufffd" not in qwen.decode(ids[:k])
    # A continuation cut at its budget inside a character loses only the unfinished character.
    assert trim_partial(qwen, ids[:inside]) == ids[:k]


def test_chat_specials_map_to_specials_by_role_and_name(qwen: Any, llama: Any) -> None:
    bridge = TokenizerBridge(qwen, llama)
    ids = list(
        qwen("<think>\nsmallest 3\n</think>\n\n\\boxed{3}<|im_end|>", add_special_tokens=False)["input_ids"]
    )
    to_llama = bridge.to_teacher(ids)
    assert to_llama.lossless and not to_llama.dropped
    assert llama.convert_tokens_to_ids("<think>") in to_llama.ids
    assert llama.convert_tokens_to_ids("</think>") in to_llama.ids
    # End of turn by role: Qwen's <|im_end|> is Llama's <|eot_id|>.
    assert to_llama.ids[-1] == llama.eos_token_id == llama.convert_tokens_to_ids("<|eot_id|>")
    plain = "".join(p.text for p in bridge.teacher_pieces(to_llama.ids) if not p.special)
    assert "<" not in plain and "|" not in plain  # no special leaked as literal text
    back = bridge.to_student(to_llama.ids)
    assert back.lossless and back.ids == ids


def test_special_spelled_as_text_stays_text(qwen: Any, llama: Any) -> None:
    ids = encode_plain(qwen, "the tag <think> written out")
    assert qwen.convert_tokens_to_ids("<think>") not in ids
    out = TokenizerBridge(qwen, llama).to_teacher(ids)
    assert out.lossless
    assert llama.convert_tokens_to_ids("<think>") not in out.ids
    assert llama.decode(out.ids) == "the tag <think> written out"


def test_a_special_without_counterpart_is_dropped_and_reported(qwen: Any, llama: Any) -> None:
    ids = list(qwen("a<|im_start|>b", add_special_tokens=False)["input_ids"])
    out = TokenizerBridge(qwen, llama).to_teacher(ids)
    assert out.dropped == ["<|im_start|>"]
    assert not out.lossless
    assert llama.decode(out.ids) == "ab"  # never as literal text
    assert "<|im_start|>" in check_pair(qwen, llama, ["x"]).unmapped


def test_readable_and_flat_keep_specials_apart(qwen: Any) -> None:
    bridge = TokenizerBridge(qwen, qwen)
    real = bridge.student_pieces(list(qwen("<think>", add_special_tokens=False)["input_ids"]))
    spelled = bridge.student_pieces(encode_plain(qwen, "<think>"))
    assert readable(real) == readable(spelled) == "<think>"
    assert flat(real) != flat(spelled)


def test_a_dropped_special_is_named_where_the_seam_check_reports_it(qwen: Any, llama: Any) -> None:
    """When the only loss is a dropped special, expected and got must differ by that token."""
    from distill.tokenizer_bridge.bridge import shown

    ids = list(qwen("a<|im_start|>b", add_special_tokens=False)["input_ids"])
    out = TokenizerBridge(qwen, llama).to_teacher(ids)
    assert out.text == "ab" and readable(out.source) == "ab"  # what crossed: never the token as text
    assert flat(out.source) != flat(TokenizerBridge(qwen, llama).teacher_pieces(out.ids))
    report = check_pair(qwen, llama, ["a<|im_start|>b"], cuts=None)
    row = next(row for row in report.rows if row.name == "prefix -> teacher")
    first = shown(row.failures[0])
    assert "expected 'a⟨<|im_start|>⟩', got 'a'" in first, first  # before: 'a' and 'a'


def test_shown_makes_invisible_differences_visible() -> None:
    from distill.tokenizer_bridge.bridge import shown

    nfd, nfc = "cafe\u0301", "caf\u00e9"
    assert shown(nfd) != shown(nfc) and shown(nfd) == "cafe\\u0301" and shown(nfc) == "café"
    assert shown("a\u00a0b\u200bc\td\n") == "a\\u00a0b\\u200bc\\td\\n"
    assert shown(repr("x\ue000<think>\ue001")) == "'x⟨<think>⟩'"  # as seam reports write it


def test_bridge_check_table_shows_what_differs(capsys: pytest.CaptureFixture[str]) -> None:
    from distill.cli.bridge import print_report
    from distill.tokenizer_bridge.seam import CheckRow, SeamReport

    expected, got = "cafe\u0301 [b]", "caf\u00e9 [b]"
    row = CheckRow("round trip (teacher)", cases=1, failures=[f"'x': expected {expected!r}, got {got!r}"])
    print_report(SeamReport(same=False, rows=[row], student_tokens=1, teacher_tokens=1), "s", "t")
    out = capsys.readouterr().out
    assert "expected 'cafe\\u0301 [b]', got 'café [b]'" in out  # and [b] is text, not rich markup


def test_granularity_counts_coarse_groups_and_seam_failures(qwen: Any, llama: Any) -> None:
    """The tiny llama has "10" and " product" as single tokens, the tiny qwen spells them in 2 and 8:
    "10 product" + eos is groups 2x1, 8x1 and 1x1, so 3 of 11 student tokens are finely aligned."""
    from distill.tokenizer_bridge.granularity import granularity

    assert len(llama("10 product", add_special_tokens=False)["input_ids"]) == 2
    assert len(qwen(" product", add_special_tokens=False)["input_ids"]) == 8
    grain = granularity(TokenizerBridge(qwen, llama), ["10 product", "a<|im_start|>b"])
    assert grain.samples == 2 and grain.seam_failure_rate == 0.5  # <|im_start|>: no llama counterpart
    assert "dropped" in grain.seam_failures[0]
    assert grain.sizes == {(2, 1): 1, (8, 1): 1, (1, 1): 1}
    assert grain.metrics["kl/aligned_share"] == pytest.approx(3 / 11)
    assert grain.metrics["kl/max_group_student"] == 8
    same = granularity(TokenizerBridge(qwen, qwen), ["10 product"])
    assert same.sizes == {(1, 1): 11} and same.metrics["kl/aligned_share"] == 1.0


def test_bridge_check_prints_the_alignment_granularity(tiny_zoo: Any) -> None:
    from typer.testing import CliRunner

    from distill.cli.app import app

    args = ["bridge", "check", "--student", str(tiny_zoo.tok_qwen), "--teacher", str(tiny_zoo.tok_llama)]
    result = CliRunner().invoke(app, [*args, "--items", "2", "--cuts", "4"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("alignment:"))
    share = float(line.split("%")[0].removeprefix("alignment: ")) / 100
    assert 0.5 < share < 1.0, line  # digits make some groups coarser than 2 tokens a side
    assert "(kl/aligned_share)" in line
    sizes = next(x for x in result.output.splitlines() if x.startswith("group sizes"))
    assert sizes.split(": ")[1].startswith("1x1 ")  # the most common group: one token a side
    assert "seam failures (a sample masked out of cross-family OPD): 0/" in result.output
    assert "result: lossless" in result.output  # the seam check is unchanged beside it


def test_bridge_check_prints_a_seam_failure_of_the_granularity(capsys: pytest.CaptureFixture[str]) -> None:
    from distill.cli.bridge import print_report
    from distill.tokenizer_bridge.granularity import Granularity
    from distill.tokenizer_bridge.seam import SeamReport

    grain = Granularity(
        samples=4,
        seam_failures=["'a[b]\u200b': lossy conversion (dropped <|im_start|>)"],
        metrics={"kl/aligned_share": 0.625, "kl/one_to_one_share": 0.5},
        sizes={(1, 1): 3, (3, 1): 1},
    )
    print_report(SeamReport(same=False, rows=[], student_tokens=1, teacher_tokens=1), "s", "t", grain)
    out = capsys.readouterr().out
    assert "alignment: 62.5% of student tokens in groups of <= 2 tokens a side" in out
    assert "(student x teacher tokens, 4 groups): 1x1 3 (75.0%), 3x1 1 (25.0%)" in out
    assert "seam failures (a sample masked out of cross-family OPD): 1/4 (25.0%" in out
    assert "first seam failure: 'a[b]\\u200b': lossy conversion (dropped <|im_start|>)" in out
