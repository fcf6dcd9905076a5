"""`distill bridge check`: the cross-family seam round trip on a domain's texts, as a table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.tokenizer_bridge.bridge import TokenizerBridge
    from distill.tokenizer_bridge.granularity import Granularity
    from distill.tokenizer_bridge.seam import SeamReport

bridge_app = typer.Typer(help="The tokenizer bridge between a student and a teacher.", no_args_is_help=True)


def load_tokenizer(name: str, domain: str, label: str = "tokenizer") -> PreTrainedTokenizerBase:
    """A tokenizer from `zoo:<name>` (built on first use), a local folder, or a hub id; one
    ValueError line starting with `label` (the option) when there is none."""
    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo import resolve_model
    from distill.zoo.check import check_model_name
    from distill.zoo.families import model_rows

    check_model_name(name, domain, label, tokenizer_only=True)  # before a zoo build or a load
    path = resolve_model(name, domain_config(domain), get_settings())
    from transformers import AutoTokenizer  # seconds to import: only once the name checked out

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokenizer.init_kwargs["distill_rows"] = model_rows(path)  # the embedding beside it, if any
        return tokenizer
    except (OSError, ValueError) as exc:
        # transformers explains a broken folder over several lines; the first one says it.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{label}: cannot load a tokenizer from {name}: {first}") from None


def domain_texts(domain: str, items: int) -> list[str]:
    """Prompts and worked solutions of the domain's first eval items (what crosses the seam)."""
    from distill.config import domain_config
    from distill.domains import build_domain

    texts: list[str] = []
    for item in build_domain(domain_config(domain)).eval_items()[:items]:
        texts.append(item.prompt)
        if item.solution:
            texts.append(item.solution)
    return texts


def granularity_lines(grain: Granularity) -> list[str]:
    """How fine the pair's byte groups are on the checked texts: what a per-token OPD signal can
    resolve (cross-family OPD, docs/cross_family.md). Plain text: printed as rich Text, so brackets
    in a failing text are not markup."""
    m = grain.metrics
    groups = sum(grain.sizes.values())
    sizes = ", ".join(
        f"{s}x{t} {n} ({n / groups:.1%})" if groups else f"{s}x{t} {n}" for (s, t), n in grain.common_sizes()
    )
    failed = len(grain.seam_failures)
    lines = [
        f"alignment: {m.get('kl/aligned_share', 1.0):.1%} of student tokens in groups of <= 2 tokens a side "
        f"(kl/aligned_share), {m.get('kl/one_to_one_share', 1.0):.1%} one to one; largest group "
        f"{m.get('kl/max_group_student', 0.0):.0f} student x {m.get('kl/max_group_teacher', 0.0):.0f} teacher tokens",
        f"group sizes (student x teacher tokens, {groups} groups): {sizes or 'none'}",
        f"seam failures (a sample masked out of cross-family OPD): {failed}/{grain.samples} "
        f"({grain.seam_failure_rate:.1%}, bridge/seam_failure_rate)",
    ]
    if grain.seam_failures:
        lines.append(f"first seam failure: {grain.seam_failures[0]}")
    return lines


def rows_line(who: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """A side's tokenizer size against its embedding rows (ids past the tokenizer decode to no text:
    a sample holding one is masked and counted, never converted)."""
    rows = tokenizer.init_kwargs.get("distill_rows")
    size = len(tokenizer)
    if not isinstance(rows, int):
        return f"{who}: tokenizer {size:,} entries (no model beside it: embedding rows unknown)"
    if rows > size:
        gap = f"ids {size:,}..{rows - 1:,} have no text"
    elif rows < size:
        gap = f"tokenizer ids {rows:,}..{size - 1:,} have no embedding row"
    else:
        gap = "one row per entry"
    return f"{who}: tokenizer {size:,} entries, embedding {rows:,} rows ({gap})"


def specials_lines(bridge: TokenizerBridge) -> list[str]:
    """The special-token map the bridge uses, by meaning (end of turn, eos, bos, pad), both ways."""
    from distill.tokenizer_bridge.bridge import special_map_lines

    return [
        "special tokens (by meaning; an eos never becomes a pad):",
        *(f"  {line}" for line in special_map_lines(bridge)),
    ]


def print_report(
    report: SeamReport,
    student: str,
    teacher: str,
    grain: Granularity | None = None,
    bridge: TokenizerBridge | None = None,
) -> None:
    from rich.table import Table
    from rich.text import Text

    from distill.cli.common import console as make_console
    from distill.tokenizer_bridge.bridge import shown

    console = make_console()
    same = "  (same tokenizer: training bypasses the bridge)" if report.same else ""
    console.print(f"[bold]bridge check[/bold]  student {student}  teacher {teacher}{same}")
    table = Table()
    for column in ("check", "cases", "ok", "failed", "first failure"):
        table.add_column(column, justify="right" if column in ("cases", "ok", "failed") else "left")
    for row in report.rows:
        n_bad = len(row.failures)
        table.add_row(
            row.name,
            str(row.cases),
            str(row.cases - n_bad),
            f"[red]{n_bad}[/red]" if n_bad else "0",
            # Specials as ⟨name⟩ (a dropped one is named), invisible characters escaped: the
            # column shows what differs; Text, so brackets in the texts are not rich markup.
            Text(shown(row.failures[0])) if row.failures else "",
        )
    console.print(table)
    console.print(
        f"tokens: student {report.student_tokens}, teacher {report.teacher_tokens}, "
        f"teacher/student ratio {report.ratio:.3f}"
    )
    console.print(
        f"anchors: {report.anchored} of {report.seams} seams crossed only read and written in place, "
        f"after the tokens before them (bridge/anchor_rescue_rate in ROSE)"
    )
    if bridge is not None:
        for line in [rows_line("student", bridge.student), rows_line("teacher", bridge.teacher)]:
            console.print(line, soft_wrap=True)
        for line in specials_lines(bridge):
            console.print(Text(line), soft_wrap=True)
    if report.unmapped:
        console.print(
            f"student specials without a teacher counterpart (dropped and counted if a prefix holds one): "
            f"{', '.join(report.unmapped)}"
        )
    if grain is not None:
        for line in granularity_lines(grain):
            console.print(Text(shown(line) if line.startswith("first seam failure") else line))
    failed = sum(len(row.failures) for row in report.rows)
    verdict = "[green]lossless[/green]" if report.ok else f"[red]LOSSY: {failed} failing cases[/red]"
    console.print(f"result: {verdict}")


@bridge_app.command(
    "check",
    help="Round-trip domain prompts, worked solutions and hard texts (unicode, whitespace runs, digits, "
    "chat specials) through student ids -> text -> teacher ids -> text -> student ids, cutting at token "
    "boundaries. Prints a table, then the pair's alignment granularity on the same texts (the byte groups "
    "cross-family OPD computes its signal on); exit 1 on any loss, 2 on bad input.",
)
def check(
    student: Annotated[str, typer.Option(help="student: zoo:<name>, a local folder or a hub id")],
    teacher: Annotated[str, typer.Option(help="teacher: zoo:<name>, a local folder or a hub id")],
    domain: Annotated[str, typer.Option(help="domain whose texts are checked")] = "rlve",
    items: Annotated[int, typer.Option(help="eval items whose prompt and solution are checked")] = 50,
    cuts: Annotated[int, typer.Option(help="cut points per text (0: every token boundary)")] = 16,
) -> None:
    from distill.cli.common import fail
    from distill.config import ConfigError
    from distill.tokenizer_bridge.bridge import TokenizerBridge
    from distill.tokenizer_bridge.granularity import granularity
    from distill.tokenizer_bridge.seam import check_pair, hard_texts
    from distill.zoo.check import check_model_name

    try:
        # Both names first: a typo in --teacher must not wait for a zoo build of the student.
        for name, label in ((student, "--student"), (teacher, "--teacher")):
            check_model_name(name, domain, label, tokenizer_only=True)
        student_tok = load_tokenizer(student, domain, "--student")
        teacher_tok = load_tokenizer(teacher, domain, "--teacher")
        texts = domain_texts(domain, items) + hard_texts(student_tok, teacher_tok)
    except (ValueError, ConfigError) as exc:
        raise fail(str(exc)) from None
    report = check_pair(student_tok, teacher_tok, texts, cuts=cuts or None)
    # The same texts, each as a whole student completion, cut into byte groups (cross-family OPD).
    bridge = TokenizerBridge(student_tok, teacher_tok)
    grain = granularity(bridge, texts)
    print_report(report, student, teacher, grain, bridge)
    raise typer.Exit(0 if report.ok else 1)
