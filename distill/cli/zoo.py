"""`distill zoo`: the embedded default's models, built here and cached."""

from __future__ import annotations

from typing import Annotated

import typer

from distill.cli.common import fail

zoo_app = typer.Typer(
    help="The embedded default's tiny models, built locally and cached.", no_args_is_help=True
)


@zoo_app.command("build", help="Build zoo entries for a domain (default: all).")
def zoo_build(
    names: Annotated[list[str] | None, typer.Argument(help="e.g. teacher student tok-llama")] = None,
    domain: Annotated[str, typer.Option(help="domain whose data the models learn")] = "rlve",
) -> None:
    from distill.cli.report import zoo_build as build

    try:
        build(names or [], domain)
    except ValueError as exc:
        raise fail(str(exc)) from None


@zoo_app.command("ls", help="List built zoo entries with their recipe keys and eval scores.")
def zoo_ls() -> None:
    from distill.cli.report import zoo_ls as ls

    ls()
