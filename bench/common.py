"""Shared helpers for benchmarks: timing of whole commands, medians, the result table."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence


def time_command(argv: Sequence[str], env: dict[str, str] | None = None, check: bool = True) -> float:
    started = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    if check and proc.returncode != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(argv)}\n{proc.stderr}")
    return elapsed


def median_of(runs: int, measure: Callable[[], float], warmup: int = 1) -> float:
    for _ in range(warmup):
        measure()
    return statistics.median(measure() for _ in range(runs))


def corral_argv(*args: str) -> list[str]:
    """The installed console script, as a user runs it."""
    exe = os.path.join(os.path.dirname(sys.executable), "corral")
    return [exe if os.path.exists(exe) else "corral", *args]


def print_table(title: str, rows: list[tuple[str, float, float | None, str]]) -> None:
    """rows: (what, seconds, baseline seconds or None, goal)."""
    print(f"\n{title}")
    print(f"{'measure':66} {'seconds':>9} {'baseline':>9} {'ratio':>7}  goal")
    for what, seconds, baseline, goal in rows:
        base = f"{baseline:9.3f}" if baseline is not None else f"{'-':>9}"
        ratio = f"{seconds / baseline:6.2f}x" if baseline else f"{'-':>7}"
        print(f"{what:66} {seconds:9.3f} {base} {ratio}  {goal}")
