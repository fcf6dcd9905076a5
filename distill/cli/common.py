"""What every command shares: the one-line failure and the console tables are printed to."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console


def fail(message: str, code: int = 2) -> typer.Exit:
    """One clear line on stderr and a non-zero exit."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def console() -> Console:
    """A rich console; off a terminal it assumes 200 columns (rich's 80 folds run ids and tables
    that are read in logs and CI too)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)
