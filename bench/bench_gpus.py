"""`corral gpus` over every cluster vs the slowest single `ssh <cluster> sinfo`, and CLI cold start.

Run as root on a machine with the testbed (`python -m testbed up`):  python bench/bench_gpus.py
Both sides are measured in the same run, against the same login nodes:
- cold: no ControlMaster anywhere and no server (a fresh CORRAL_HOME for Corral, so the call starts the
  server; ControlMaster=no for ssh): a person's first call;
- warm: Corral's server and masters already up vs plain ssh over a ControlMaster of its own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, close_masters, corral_argv, median_of, print_table, time_command  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with bench_testbed() as bench:
        clusters = bench.clusters

        def slowest_sinfo(mux: bool) -> float:
            return max(time_command([*bench.raw_ssh(c, mux=mux), "sinfo"]) for c in clusters)

        def parallel_sinfo() -> float:
            """What a shell script would do: `ssh <c> sinfo &` for every cluster, then wait."""
            started = time.perf_counter()
            procs = [subprocess.Popen([*bench.raw_ssh(c, mux=False), "sinfo"], stdout=subprocess.DEVNULL)
                     for c in clusters]
            if any(p.wait() for p in procs):
                raise SystemExit("ssh sinfo failed")
            return time.perf_counter() - started

        counter = iter(range(10**6))

        def corral_gpus_cold(*flags: str) -> float:
            cold = bench.scratch / f"cold-home-{next(counter)}"
            seconds = time_command(corral_argv("gpus", *flags), env={**bench.env, "CORRAL_HOME": str(cold)})
            close_masters(cold.parent)
            return seconds

        def corral_gpus_warm(*flags: str) -> float:
            return time_command(corral_argv("gpus", *flags), env=bench.env)

        baseline_cold = median_of(args.runs, lambda: slowest_sinfo(mux=False))
        gpus_cold = median_of(args.runs, lambda: corral_gpus_cold("--json"))
        table_cold = median_of(args.runs, corral_gpus_cold)  # the table a person reads, not only --json
        parallel_cold = median_of(args.runs, parallel_sinfo)
        baseline_warm = median_of(args.runs, lambda: slowest_sinfo(mux=True))
        gpus_warm = median_of(args.runs, lambda: corral_gpus_warm("--json"))
        table_warm = median_of(args.runs, corral_gpus_warm)
        table_shared = median_of(args.runs, lambda: corral_gpus_warm("--max-age", "10"))
        python_start = median_of(args.runs, lambda: time_command([sys.executable, "-c", "pass"]))
        help_time = median_of(args.runs, lambda: time_command(corral_argv("--help"), env=bench.env))
    print_table(
        f"corral gpus over {len(clusters)} clusters (median of {args.runs} runs)",
        [
            ("corral gpus (table), first call: starts the server (vs slowest ssh sinfo, new conn)", table_cold,
             baseline_cold, "-"),
            ("corral gpus (table), server and masters up (vs slowest ssh sinfo, new conn)", table_warm,
             baseline_cold, "<= 0.5x"),
            ("corral gpus --max-age 10 (table), server up (vs slowest ssh sinfo, new conn)", table_shared,
             baseline_cold, "<= 0.5x"),
            ("corral gpus --json, first call (vs slowest ssh sinfo, new conn)", gpus_cold, baseline_cold, "-"),
            ("corral gpus --json, first call (vs ssh sinfo to all, parallel)", gpus_cold, parallel_cold,
             "-"),
            ("corral gpus --json, server up (vs slowest ssh sinfo, new conn)", gpus_warm, baseline_cold,
             "<= 1.3x"),
            ("corral gpus --json, server up (vs slowest ssh sinfo, mux)", gpus_warm, baseline_warm, "-"),
            ("corral --help cold start (baseline: python -c pass)", help_time, python_start, "<= 0.3 s"),
        ],
    )


if __name__ == "__main__":
    main()
