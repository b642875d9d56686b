"""Times for people, one wording everywhere (the CLI's tables and the server's explanations). Pure."""

from __future__ import annotations

import time


def minutes(seconds: float) -> str:
    """A duration for people: "12 min", "3.5 h"; negative is "… later"."""
    if seconds < 0:
        return f"{minutes(-seconds)} later"
    value = seconds / 60
    return f"{value:.0f} min" if value < 120 else f"{value / 60:.1f} h"


def clock(epoch: float | None) -> str:
    """A moment today as people read it on this machine: 14:05:09 (local time); "unknown" for None."""
    return time.strftime("%H:%M:%S", time.localtime(epoch)) if epoch else "unknown"


def when(epoch: float | None) -> str:
    """A moment as a table shows it: 2026-12-05 20:37:55 (local time); "-" for None."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch is not None else "-"


def expected_start(epoch: object) -> str:
    """"Slurm expects it to start 14:05:09" for a moment still ahead; "" otherwise."""
    return (f"Slurm expects it to start {clock(epoch)}"
            if isinstance(epoch, (int, float)) and epoch > time.time() else "")


def duration(seconds: float) -> str:
    """A compact duration for a table cell: 45s, 12m, 3h05m, 2d4h."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600}h"


def start_text(*, can_start_now: bool, predicted_start: float | None, prediction: str | None,
               feasible: bool) -> str:
    """When a candidate place would start a task, as a plan shows it."""
    if can_start_now:
        return "now"
    if predicted_start is None:
        return (prediction or "-")[:60] if feasible else "-"
    delta = predicted_start - time.time()
    if delta > 86400 * 365:
        return "not foreseeable"
    return "now" if delta < 60 else f"in {duration(delta)}"


def slurm_time(seconds: float) -> str:
    """A duration as Slurm writes a time limit or the time left: 4:05:09, 2-00:00:00 (never negative)."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    minutes_seconds = f"{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{rest // 3600:02d}:{minutes_seconds}" if days else f"{rest // 3600}:{minutes_seconds}"
