"""The controller's cost per tick with many managed jobs, and how fast a pending job moves.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_controller.py
(`--clusters 50`: part 1 only, over the scale mode's 50 small clusters instead of the main three.)
1. N managed jobs (held in Slurm, so nothing runs): the first tick submits them (arrays), the second
   records every job's first state; then steady-state ticks: SSH round trips per cluster and the
   controller's CPU seconds per tick, vs a raw `ssh <login> squeue` per cluster (what any poller
   must at least pay).
2. Time from capacity freeing on another cluster to the re-routed job running there.
`--light-squeue`: the main clusters' login nodes take `squeue --only-job-state` (`python -m testbed
light-squeue`), and the table adds how many full status queries (`squeue -t all`) a steady tick ran, of all clusters.
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
    parser.add_argument("--ticks", type=int, default=7, help="steady ticks measured, after the one that records "
                                                                "the submitted jobs' first states")
    parser.add_argument("--intervals", type=float, nargs="*", default=[1.0, 5.0])
    parser.add_argument("--clusters", type=int, default=0, help="the scale mode's N clusters (ticks only)")
    parser.add_argument("--light-squeue", action="store_true", help="login nodes with squeue --only-job-state "
                                                                     "(the main clusters only)")
    args = parser.parse_args()
    scale = None
    if args.light_squeue and args.clusters:
        parser.error("--light-squeue is for the main three clusters")
    if args.clusters:
        from testbed.bed import scale_testbed

        scale = scale_testbed(args.clusters)
        args.intervals = []  # the move needs the main clusters' shapes
    with bench_testbed(scale) as bench:
        for key in ("CORRAL_SLURM_CONFIG", "CORRAL_HOME"):
            os.environ[key] = bench.env[key]
        from corral import managed
        from corral.client import Client
        from corral.controller.engine import Controller, ControllerSettings
        from corral.state import Store
        from corral.task import parse_task

        logs = []
        if args.light_squeue:
            from testbed import Testbed

            logs = [Testbed().light_squeue(c) for c in bench.clusters]
        rows = []
        for n in args.jobs:
            _cancel_all(bench)
            store = Store(f"sqlite:///{bench.scratch / f'state-{n}.db'}")
            managed.record(store, parse_task(__import__("yaml").safe_load(HELD), "bench"), "bench", n)
            controller = Controller(Client(), store, "bench", ControllerSettings(reroute_after=1e9))
            started = time.perf_counter()
            first = asyncio.run(controller.tick())
            first_seconds = time.perf_counter() - started
            cpu, trips, full = [], [], []
            for _ in range(args.ticks + 1):
                for log in logs:
                    log.write_text("")
                before = time.process_time()
                report = asyncio.run(controller.tick())
                cpu.append(time.process_time() - before)
                trips.append(sum(report.round_trips.values()))
                full.append(sum(_status_queries(log) for log in logs))
            # The tick after the first writes every job's first state (PENDING and Slurm's reason); a
            # steady tick writes only what changed.
            steady = sorted(cpu[1:])
            full_steady = sorted(full[1:])[len(full[1:]) // 2] if logs else None
            rows.append((n, first.submitted, first_seconds, cpu[0], steady[len(steady) // 2], max(trips),
                         full_steady))
        if args.light_squeue:
            from testbed import Testbed

            for c in bench.clusters:
                Testbed().light_squeue(c, on=False)
        raw = max(time_command([*bench.raw_ssh(c), "squeue --me -h -t all -r"]) for c in bench.clusters)
        move_seconds = []
        for interval in args.intervals:
            _cancel_all(bench)
            try:
                move_seconds.append(_time_to_move(bench, interval))
            finally:
                _cancel_all(bench)
    print("\ncontroller ticks with many managed jobs (jobs held in Slurm)")
    print(f"{'managed jobs':>13} {'submitted':>10} {'first tick s':>13} {'CPU s, 2nd tick':>16} "
          f"{'CPU s/steady tick':>18} {'SSH calls/tick':>15}" + (f" {'full squeue/steady tick':>24}" if logs else ""))
    for n, submitted, first_seconds, second_cpu, cpu, trips, full_steady in rows:
        print(f"{n:>13} {submitted:>10} {first_seconds:>13.2f} {second_cpu:>16.3f} {cpu:>18.3f} {trips:>15}"
              + (f" {full_steady:>24}" if logs else ""))
    print(f"  CPU s/steady tick: the median of {args.ticks} ticks after the 2nd, which records every job's first "
          "state")
    print(f"  clusters: {len(bench.clusters)}; raw ssh squeue (slowest cluster, mux): {raw:.3f} s")
    print("\ntime from capacity freeing on another cluster to the moved job running there")
    for interval, seconds in zip(args.intervals, move_seconds):
        print(f"  tick interval {interval:g} s (reroute_after 2 s): {seconds:.1f} s")


def _time_to_move(bench, interval: float) -> float:
    """alpine and borealis full; a managed job waits on alpine; free borealis; until it runs there."""
    from corral import managed
    from corral.client import Client
    from corral.controller.engine import Controller, ControllerSettings
    from corral.state import Store
    from corral.task import parse_task

    def sbatch(cluster: str, args: str) -> str:
        return subprocess.run([*bench.raw_ssh(cluster), f"sbatch -o /dev/null --parsable {args} --wrap 'sleep 600'"],
                              capture_output=True, text=True, check=True).stdout.strip()

    blockers = {"alpine": sbatch("alpine", "-p gpu -N2 -t 60 --gres=gpu:nvidia_h100_80gb_hbm3:4"),
                "borealis": sbatch("borealis", "-p h100-cluster -N2 -t 600 --gres=gpu:H100:8")}
    blocker = blockers["borealis"]
    for cluster, job in blockers.items():  # both clusters full before the managed job arrives
        deadline = time.monotonic() + 60
        while subprocess.run([*bench.raw_ssh(cluster), f"squeue -h -j {job} -o %T"], capture_output=True,
                             text=True).stdout.strip() != "RUNNING":
            if time.monotonic() > deadline:
                raise SystemExit(f"{cluster}'s blocker never started")
            time.sleep(0.2)
    store = Store(f"sqlite:///{bench.scratch / f'move-{interval}.db'}")
    task = parse_task({"resources": {"ordered": [{"accelerators": "H100:4", "infra": "slurm/alpine"},
                                                 {"accelerators": "H100:4", "infra": "slurm/borealis"}]},
                       "run": "sleep 30"}, "bench")
    [job_id] = managed.record(store, task, "bench")
    controller = Controller(Client(), store, f"move-{interval}", ControllerSettings(reroute_after=2))

    def state() -> tuple[str, str | None]:
        view = managed.views(store, [job_id])[0]
        return view.managed.state, view.latest.cluster if view.latest else None

    deadline = time.monotonic() + 120
    while state() != ("PENDING", "alpine") or not managed.views(store, [job_id])[0].latest.slurm_job_id:
        asyncio.run(controller.tick())
        if time.monotonic() > deadline:
            raise SystemExit("the job never waited on alpine")
    time.sleep(2.5)  # past reroute_after, as in steady state
    subprocess.run([*bench.raw_ssh("borealis"), f"scancel {blocker}"], check=True)
    freed = time.monotonic()
    while state() != ("RUNNING", "borealis"):
        started = time.monotonic()
        asyncio.run(controller.tick())
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
        if time.monotonic() - freed > 120:
            raise SystemExit("the job did not move")
    return time.monotonic() - freed


def _status_queries(log: Path) -> int:
    """The full status queries (`squeue … -t all`) in a light-squeue call log, not the probes' squeue."""
    return sum(1 for line in log.read_text().splitlines() if line.startswith("full ") and " -t all " in line)


def _cancel_all(bench) -> None:
    for cluster in bench.clusters:
        subprocess.run([*bench.raw_ssh(cluster), "scancel -u corral-test"], capture_output=True)


if __name__ == "__main__":
    main()
