"""The controller's cost per tick with many managed jobs, and how fast a pending job moves.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_controller.py
1. N managed jobs (held in Slurm, so nothing runs): the first tick submits them (arrays); then
   steady-state ticks: SSH round trips per cluster and the controller's CPU seconds per tick, vs a
   raw `ssh <login> squeue` per cluster (what any poller must at least pay).
2. Time from capacity freeing on another cluster to the re-routed job running there.
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

from bench.common import bench_testbed, time_command  # noqa: E402

HELD = "resources:\n  cpus: 1\nslurm:\n  sbatch_args: [--hold]\nrun: 'true'\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args()
    with bench_testbed() as bench:
        for key in ("CORRAL_SLURM_CONFIG", "CORRAL_HOME"):
            os.environ[key] = bench.env[key]
        from corral import managed
        from corral.client import Client
        from corral.controller.engine import Controller, ControllerSettings
        from corral.state import Store
        from corral.task import parse_task

        rows = []
        for n in args.jobs:
            _cancel_all(bench)
            store = Store(f"sqlite:///{bench.scratch / f'state-{n}.db'}")
            managed.record(store, parse_task(__import__("yaml").safe_load(HELD), "bench"), "bench", n)
            controller = Controller(Client(), store, "bench", ControllerSettings(reroute_after=1e9))
            started = time.perf_counter()
            first = asyncio.run(controller.tick())
            first_seconds = time.perf_counter() - started
            cpu, trips = [], []
            for _ in range(args.ticks):
                before = time.process_time()
                report = asyncio.run(controller.tick())
                cpu.append(time.process_time() - before)
                trips.append(sum(report.round_trips.values()))
            rows.append((n, first.submitted, first_seconds, sorted(cpu)[len(cpu) // 2], max(trips)))
        raw = max(time_command([*bench.raw_ssh(c), "squeue --me -h -t all -r"]) for c in bench.clusters)
        _cancel_all(bench)
    print("\ncontroller ticks with many managed jobs (jobs held in Slurm)")
    print(f"{'managed jobs':>13} {'submitted':>10} {'first tick s':>13} {'CPU s/tick':>11} {'SSH calls/tick':>15}")
    for n, submitted, first_seconds, cpu, trips in rows:
        print(f"{n:>13} {submitted:>10} {first_seconds:>13.2f} {cpu:>11.3f} {trips:>15}")
    print(f"  clusters: {len(bench.clusters)}; raw ssh squeue (slowest cluster, mux): {raw:.3f} s")


def _cancel_all(bench) -> None:
    for cluster in bench.clusters:
        subprocess.run([*bench.raw_ssh(cluster), "scancel -u corral-test"], capture_output=True)


if __name__ == "__main__":
    main()
