"""The CLI's two rich consoles, in a module light enough for commands that import nothing else."""

from __future__ import annotations

import sys

from rich.console import Console

from corral.timefmt import minutes  # noqa: F401 - re-exported for the tables

# Piped output (scripts, CI logs) is not cut to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
