"""The CLI's two rich consoles, in a module light enough for commands that import nothing else."""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from rich.console import Console

from corral.timefmt import minutes  # noqa: F401 - re-exported for the tables

if TYPE_CHECKING:
    from rich.table import Table

# Piped output (scripts, CI logs) is not cut to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def table(columns: Iterable[str], *, right: Collection[str] = (), show_header: bool = True) -> Table:
    """Every table the CLI prints: no borders, bold headers, these columns (those in `right` aligned right)."""
    from rich.table import Table

    shown = Table(box=None, header_style="bold", show_header=show_header)
    for column in columns:
        shown.add_column(column, justify="right" if column in right else "left")
    return shown
