"""The dashboard: the Jobs page's first paint with 10,000 jobs in the store, and the server's CPU with
10 dashboards open for a minute.

Run as root with the testbed (`python -m testbed up`) and Debian's chromium:
    python bench/bench_dashboard.py [--jobs N] [--dashboards N] [--seconds S]
First paint: a fresh page of a logged-in browser, from navigation to the Jobs table drawn (its first
`/v1/jobs` answered), median of --runs; the baseline is `ssh <login> squeue --me` on a new
connection, what a person would otherwise type. CPU: the server process's user+system time over
--seconds with --dashboards Jobs pages open (each redrawing every second), against the same server
idle for the same time, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_queue import seed  # noqa: E402
from bench.common import (  # noqa: E402
    bench_testbed,
    corral_argv,
    cpu_seconds,
    median_of,
    print_table,
    time_command,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--dashboards", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with bench_testbed() as bench:
        home = Path(bench.env["CORRAL_HOME"])
        seed(home, args.jobs)
        env = bench.env
        raw = median_of(args.runs, lambda: time_command([*bench.raw_ssh("alpine", mux=False), "squeue --me"]))
        link = subprocess.run(corral_argv("dashboard", "--print-url"), env=env, capture_output=True, text=True,
                              check=True).stdout.strip()
        base = link.split("/login")[0]
        pid = json.loads((home / "controller.json").read_text())["pid"]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            context = browser.new_context()
            context.new_page().goto(link)  # logs this context in
            paints = []
            for _ in range(args.runs):
                page = context.new_page()
                started = time.perf_counter()
                page.goto(base + "/#/jobs")
                page.wait_for_selector("#jobs[data-loaded=true]", timeout=30_000)
                paints.append(time.perf_counter() - started)
                rows = page.locator("#jobs tbody tr").count()
                page.close()
            idle_before = cpu_seconds(pid)
            time.sleep(args.seconds)
            idle = cpu_seconds(pid) - idle_before
            pages = [context.new_page() for _ in range(args.dashboards)]
            for page in pages:
                page.goto(base + "/#/jobs")
                page.wait_for_selector("#jobs[data-loaded=true]", timeout=30_000)
            busy_before = cpu_seconds(pid)
            time.sleep(args.seconds)
            busy = cpu_seconds(pid) - busy_before
            browser.close()
        subprocess.run(corral_argv("server", "stop"), env=env, capture_output=True)
    paint = statistics.median(paints)
    print_table(f"the dashboard with {args.jobs:,} ended jobs in the store (median of {args.runs})", [
        ("Jobs page: navigation to the table drawn vs ssh squeue, new conn", paint, raw, "<= 1 s"),
    ])
    print(f"rows drawn: {rows} (a page of 50, newest first)")
    print(f"server CPU over {args.seconds:.0f} s: idle {100 * idle / args.seconds:.1f}% of a core; with "
          f"{args.dashboards} Jobs pages open (each redrawn every second) {100 * busy / args.seconds:.1f}%")


if __name__ == "__main__":
    main()
