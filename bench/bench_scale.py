"""The scale mode's testbed (many small Slurm clusters) and `corral gpus` across all of them.

Run as root:  python bench/bench_scale.py --clusters 50
Measured in the same run, against the same login nodes:
- the testbed itself: the time to bring N clusters up from nothing, and their daemons' resident memory;
- `corral gpus`, the table a person reads: its first call (a fresh CORRAL_HOME: the server starts and
  opens a ControlMaster per cluster) and with the server up; against `ssh <c> sinfo` to every cluster
  at once on new connections (what a shell loop with `&` does), and the slowest single one; and
  `corral gpus --max-age 10`, which answers from the server's latest probes (renewed behind the answer
  past half that age);
- the server's resident memory once it holds N clusters' masters and snapshots.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    bench_testbed,
    close_masters,
    corral_argv,
    median_of,
    print_table,
    server_pid,
    time_command,
)


def resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmRSS:"))


def main() -> None:
    from testbed.bed import daemons_memory_mb, scale_testbed

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clusters", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    bed = scale_testbed(args.clusters)
    bed.down()
    started = time.perf_counter()
    bed.up(install_user_config=False)
    start_seconds = time.perf_counter() - started
    memory_mb = daemons_memory_mb(bed)
    with bench_testbed(bed) as bench:
        clusters = bench.clusters

        def parallel_sinfo() -> float:
            began = time.perf_counter()
            procs = [subprocess.Popen([*bench.raw_ssh(c, mux=False), "sinfo"], stdout=subprocess.DEVNULL)
                     for c in clusters]
            if any(p.wait() for p in procs):
                raise SystemExit("ssh sinfo failed")
            return time.perf_counter() - began

        def slowest_sinfo() -> float:
            return max(time_command([*bench.raw_ssh(c, mux=False), "sinfo"]) for c in clusters)

        counter = iter(range(10**6))

        def gpus_cold() -> float:
            cold = bench.scratch / f"cold-home-{next(counter)}"
            seconds = time_command(corral_argv("gpus"), env={**bench.env, "CORRAL_HOME": str(cold)})
            close_masters(cold.parent)
            return seconds

        baseline_parallel = median_of(args.runs, parallel_sinfo)
        baseline_slowest = median_of(args.runs, slowest_sinfo, warmup=0)
        table_cold = median_of(args.runs, gpus_cold)
        table_warm = median_of(args.runs, lambda: time_command(corral_argv("gpus"), env=bench.env))
        table_shared = median_of(args.runs, lambda: time_command(corral_argv("gpus", "--max-age", "10"),
                                                                 env=bench.env))
        shown = subprocess.run(corral_argv("gpus", "--json"), env=bench.env, capture_output=True, text=True)
        pid = server_pid(Path(bench.env["CORRAL_HOME"]))
        server_mb = resident_mb(pid) if pid else None
    answered = shown.stdout.count('"cluster"')
    print(f"testbed: {len(clusters)} clusters up from nothing in {start_seconds:.1f} s; "
          f"their daemons hold {memory_mb:.0f} MB resident ({memory_mb / len(clusters):.1f} MB a cluster)")
    print(f"the server: {server_mb:.0f} MB resident with {len(clusters)} clusters' masters and snapshots"
          if server_mb else "the server's memory: not found")
    print(f"corral gpus --json named a cluster {answered} times (rows, over {len(clusters)} clusters)")
    print_table(
        f"corral gpus over {len(clusters)} clusters (median of {args.runs} runs)",
        [
            ("corral gpus (table), first call (vs ssh sinfo to all, parallel, new conns)", table_cold,
             baseline_parallel, "<= 3 s"),
            ("corral gpus (table), server up (vs ssh sinfo to all, parallel, new conns)", table_warm,
             baseline_parallel, "<= 0.5 s"),
            ("corral gpus (table), server up (vs slowest single ssh sinfo, new conn)", table_warm,
             baseline_slowest, "-"),
            ("corral gpus --max-age 10 (table), server up (vs ssh sinfo to all, parallel)", table_shared,
             baseline_parallel, "<= 0.5 s"),
        ],
    )


if __name__ == "__main__":
    main()
