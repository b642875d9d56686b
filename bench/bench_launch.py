"""Launch, sweep and queue costs vs raw sbatch/squeue through ssh, measured in the same run.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_launch.py
1. `corral launch -d` latency (ControlMasters up) vs `ssh <login> sbatch` over a ControlMaster;
2. a 300-job sweep over all clusters, jobs/s, vs 300 sbatch calls through one ssh session (the
   fastest a script can go without arrays) and vs 300 `ssh <login> sbatch` calls;
3. SSH round trips and wall time of one `corral queue` refresh with 1,000 tracked jobs.
All benchmark jobs are held (`--hold`) so that nothing runs, and are cancelled at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, corral_argv, median_of, print_table, time_command  # noqa: E402

HELD_TASK = "resources:\n  cpus: 1\nslurm:\n  sbatch_args: [--hold]\nrun: 'true'\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--sweep", type=int, default=300)
    parser.add_argument("--tracked", type=int, default=1000)
    args = parser.parse_args()
    n = args.sweep
    with bench_testbed() as bench:
        config, clusters, env = bench.config, bench.clusters, bench.env
        task = bench.scratch / "held.yaml"
        task.write_text(HELD_TASK)
        try:
            _cancel_all(config, clusters)
            # 1. one launch
            time_command(corral_argv("check"), env=env)  # ControlMasters up, as after any earlier command
            raw_one = median_of(args.runs, lambda: time_command(
                [*bench.raw_ssh("alpine"), "sbatch --parsable --hold -p cpu --wrap true"]))
            raw_new = median_of(args.runs, lambda: time_command(
                [*bench.raw_ssh("alpine", mux=False), "sbatch --parsable --hold -p cpu --wrap true"]))
            pinned = median_of(args.runs, lambda: time_command(
                corral_argv("launch", "-d", "--infra", "slurm/alpine/cpu", str(task)), env=env))
            anywhere = median_of(args.runs, lambda: time_command(corral_argv("launch", "-d", str(task)), env=env))
            _cancel_all(config, clusters)

            # 2. a sweep
            started = time.perf_counter()
            subprocess.run([*bench.raw_ssh("alpine"), f"for i in $(seq {n}); do sbatch --hold -p cpu --wrap true; done"],
                           check=True, capture_output=True)
            raw_loop = time.perf_counter() - started
            _cancel_all(config, clusters)
            few = min(n, 60)  # separate ssh calls are slow: time 60 and scale
            started = time.perf_counter()
            for i in range(few):
                subprocess.run([*bench.raw_ssh(clusters[i % len(clusters)]), "sbatch --hold --wrap true"],
                               check=True, capture_output=True)
            raw_calls = (time.perf_counter() - started) * n / few
            _cancel_all(config, clusters)
            sweep = time_command(corral_argv("launch", "-d", "--num-jobs", str(n), str(task)), env=env)
            _cancel_all(config, clusters)

            # 3. queue refresh with many tracked jobs
            time_command(corral_argv("launch", "-d", "--num-jobs", str(args.tracked), str(task)), env=env)
            trips, refresh = _refresh(env)
            raw_squeue = max(time_command([*bench.raw_ssh(c), "squeue --me -h -t all -r"]) for c in clusters)
            queue_cli = median_of(3, lambda: time_command(corral_argv("queue", "--json"), env=env), warmup=0)
        finally:
            _cancel_all(config, clusters)

    print_table(f"launch latency (median of {args.runs})", [
        ("corral launch -d --infra slurm/alpine/cpu (vs ssh sbatch, mux)", pinned, raw_one, "<= 2x"),
        ("corral launch -d --infra slurm/alpine/cpu (vs ssh sbatch, new conn)", pinned, raw_new, "<= 2x"),
        ("corral launch -d, placed over 3 clusters (vs ssh sbatch, new conn)", anywhere, raw_new, "-"),
    ])
    print_table(f"{n}-job sweep over all clusters (seconds for all; ratio < 1 is faster)", [
        ("corral launch -d --num-jobs (vs sbatch loop in one ssh)", sweep, raw_loop, "-"),
        ("corral launch -d --num-jobs (vs one ssh sbatch per job)", sweep, raw_calls, "-"),
    ])
    print(f"  jobs/s: corral {n / sweep:.0f}, sbatch loop {n / raw_loop:.0f} ({raw_loop / sweep:.1f}x), "
          f"ssh sbatch per job {n / raw_calls:.0f} ({raw_calls / sweep:.1f}x); goal >= 3x")
    print_table(f"queue refresh with {args.tracked} tracked jobs", [
        ("Tracker.refresh() in-process (vs slowest ssh squeue)", refresh, raw_squeue, "-"),
        ("corral queue --json, whole command (vs slowest ssh squeue)", queue_cli, raw_squeue, "-"),
    ])
    print(f"  SSH round trips per refresh: {trips} (clusters: {len(clusters)}; goal = number of clusters)")


def _refresh(env: dict[str, str]) -> tuple[dict[str, int], float]:
    os.environ.update({k: env[k] for k in ("CORRAL_SLURM_CONFIG", "CORRAL_HOME")})
    from corral.client import Client
    from corral.state import open_store
    from corral.tracker import Tracker

    tracker = Tracker(Client(), open_store())
    started = time.perf_counter()
    report = asyncio.run(tracker.refresh())
    return report.round_trips, time.perf_counter() - started


def _cancel_all(config: str, clusters: list[str]) -> None:
    for cluster in clusters:
        subprocess.run(["ssh", "-F", config, cluster, "scancel -u corral-test"], capture_output=True)


if __name__ == "__main__":
    main()
