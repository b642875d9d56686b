"""The CLI's two rich consoles and its one kind of table, in a module light enough for commands that
import nothing else.

What Corral prints comes from people and clusters: job names, Slurm reasons, ssh errors. Table cells
are literal text (rich would read `[/x]` in a job's name as markup and fail, and `:fire:` as an emoji);
a cell with a style is made with `styled`. Text put into a `print` of our own markup goes through
`literal`. Neither console colours numbers and paths on its own (`highlight`): a column of states is
coloured by state, not by whatever looks like a number.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape as literal  # noqa: F401 - for the callers' f-strings of markup
from rich.text import Text

from corral.timefmt import minutes  # noqa: F401 - re-exported for the tables

if TYPE_CHECKING:
    from rich.table import Table

# Piped output (scripts, CI logs) is not cut to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200, emoji=False, highlight=False)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200, emoji=False, highlight=False)


def styled(text: str, style: str = "") -> Text:
    """One table cell (or part of one) shown in `style` ("" for none), its text taken literally."""
    return Text(text, style=style)


# A job's state, a managed job's included (RECOVERING, CANCELLING), as every table shows it.
_STATE_STYLES = {"RUNNING": "green", "PENDING": "yellow", "RECOVERING": "yellow", "SUCCEEDED": "dim",
                 "CANCELLED": "dim", "CANCELLING": "dim", "FAILED": "red", "SUBMIT_FAILED": "red", "LOST": "red"}


def state_cell(state: str) -> Text:
    return styled(state, _STATE_STYLES.get(state, ""))


@functools.cache
def _literal_table() -> type[Table]:
    """rich's Table whose `add_row` takes a str cell literally (imported at the first table)."""
    from rich.table import Table

    class LiteralTable(Table):
        def add_row(self, *cells: Any, **options: Any) -> None:
            super().add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in cells), **options)

    return LiteralTable


def table(columns: Iterable[str], *, right: Collection[str] = (), show_header: bool = True) -> Table:
    """Every table the CLI prints: no borders, bold headers, these columns (those in `right` aligned right),
    and literal cells."""
    shown = _literal_table()(box=None, header_style="bold", show_header=show_header)
    for column in columns:
        shown.add_column(column, justify="right" if column in right else "left")
    return shown
