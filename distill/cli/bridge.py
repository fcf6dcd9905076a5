"""`distill bridge check`: the cross-family seam round trip on a domain's texts, as a table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.tokenizer_bridge.seam import SeamReport

bridge_app = typer.Typer(help="The tokenizer bridge between a student and a teacher.", no_args_is_help=True)


def load_tokenizer(name: str, domain: str) -> PreTrainedTokenizerBase:
    """A tokenizer from `zoo:<name>` (built on first use), a local folder, or a hub id."""
    from transformers import AutoTokenizer

    from distill.config import domain_config
    from distill.settings import get_settings
    from distill.zoo import resolve_model

    path = resolve_model(name, domain_config(domain), get_settings())
    if path.startswith((".", "/", "~")) and not Path(path).expanduser().is_dir():
        raise ValueError(f"no tokenizer folder {name!r}")
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load a tokenizer from {name!r}: {exc}") from None


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


def print_report(report: SeamReport, student: str, teacher: str) -> None:
    from rich.table import Table

    from distill.cli.common import console as make_console

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
            row.failures[0] if row.failures else "",
        )
    console.print(table)
    console.print(
        f"tokens: student {report.student_tokens}, teacher {report.teacher_tokens}, "
        f"teacher/student ratio {report.ratio:.3f}"
    )
    if report.unmapped:
        console.print(
            f"student specials without a teacher counterpart (dropped and counted if a prefix holds one): "
            f"{', '.join(report.unmapped)}"
        )
    failed = sum(len(row.failures) for row in report.rows)
    verdict = "[green]lossless[/green]" if report.ok else f"[red]LOSSY: {failed} failing cases[/red]"
    console.print(f"result: {verdict}")


@bridge_app.command(
    "check",
    help="Round-trip domain prompts, worked solutions and hard texts (unicode, whitespace runs, digits, "
    "chat specials) through student ids -> text -> teacher ids -> text -> student ids, cutting at token "
    "boundaries. Prints a table; exit 1 on any loss, 2 on bad input.",
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
    from distill.tokenizer_bridge.seam import check_pair, hard_texts

    try:
        student_tok = load_tokenizer(student, domain)
        teacher_tok = load_tokenizer(teacher, domain)
        texts = domain_texts(domain, items) + hard_texts(student_tok)
    except (ValueError, ConfigError) as exc:
        raise fail(str(exc)) from None
    report = check_pair(student_tok, teacher_tok, texts, cuts=cuts or None)
    print_report(report, student, teacher)
    raise typer.Exit(0 if report.ok else 1)
