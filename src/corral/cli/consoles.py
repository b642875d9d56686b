"""The CLI's two rich consoles, in a module light enough for commands that import nothing else."""

from __future__ import annotations

import sys

from rich.console import Console

# Piped output (scripts, CI logs) is not cut to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def minutes(seconds: float) -> str:
    """A duration for people: "12 min", "3.5 h"; negative is "… later"."""
    if seconds < 0:
        return f"{minutes(-seconds)} later"
    value = seconds / 60
    return f"{value:.0f} min" if value < 120 else f"{value / 60:.1f} h"
