"""Rich rendering of command results (tables on stdout, problems on stderr)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from corral.client import GpuReport, ProbeOutcome

# Piped output (scripts, CI logs) is not cut to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def render_check(outcomes: list[ProbeOutcome]) -> None:
    table = Table(box=None, header_style="bold")
    for column in ("CLUSTER", "STATUS", "SLURM", "PARTITIONS", "GPU TYPES", "TIME"):
        table.add_column(column)
    for o in outcomes:
        s = o.snapshot
        if s is None:
            table.add_row(o.cluster, f"[red]FAIL[/red] ({o.error_kind})", "-", "-", "-", f"{o.seconds:.2f}s")
            continue
        partitions = ", ".join(p.name + ("*" if p.default else "") for p in s.partitions)
        table.add_row(o.cluster, "[green]OK[/green]", s.slurm_version or "?", partitions,
                      ", ".join(s.gpu_types) or "-", f"{o.seconds:.2f}s")
    console.print(table)
    for o in outcomes:
        if o.error:
            err_console.print(f"[red]✗[/red] {o.error_message}", highlight=False)


def render_gpus(report: GpuReport, gpu: str | None) -> None:
    table = Table(box=None, header_style="bold")
    for column in ("CLUSTER", "PARTITION", "GPU", "GRES TYPE", "FREE", "TOTAL", "NODES", "PENDING"):
        table.add_column(column, justify="right" if column in ("FREE", "TOTAL", "NODES", "PENDING") else "left")
    for r in report.rows:
        free = f"[green]{r.free}[/green]" if r.free else "[dim]0[/dim]"
        table.add_row(r.cluster, r.partition, r.gpu, r.gres_type or "(untyped)", free, str(r.total),
                      str(r.nodes), str(r.pending))
    for f in report.failures:
        table.add_row(f.cluster, "[red]unavailable[/red]", "-", "-", "-", "-", "-", "-")
    if report.rows or report.failures:
        console.print(table)
    else:
        console.print(f"No GPUs{' matching ' + repr(gpu) if gpu else ''} on any cluster.")
    for f in report.failures:
        err_console.print(f"[red]✗[/red] {f.error_message}", highlight=False)
