"""One cluster's slurmctld alive but silent: how long the controller's ticks take, how soon a
managed job on another cluster is seen to end, and how long `corral queue` takes.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_frozen.py
A plain `sleep` job runs on every cluster (so each is asked every tick). cirrus' slurmctld is then
stopped in its tracks (SIGSTOP: `Testbed.freeze_controller`) for `--seconds`, and two managed jobs
of `sleep 5` are started: one on alpine, one placed over the three clusters. The controller ticks
every `--interval` seconds, in process. Reported: each tick's wall time while cirrus is frozen (the
first places both jobs), and the seconds from each managed job's submission to the tick that sees it
SUCCEEDED. Then, with the server up (`corral server start`), `corral queue` is
run again and again while cirrus is frozen for `--seconds` more (each call as soon as the last ended):
the calls' median and longest wall time, and how many took over 1 s; then `--launches` times
`corral launch -d --cpus 1 -- true`, placed over the three clusters. Baselines, in the same run:
`ssh cirrus squeue` against the frozen controller (how long a caller that waits for every cluster
waits), `ssh alpine squeue`, and `ssh alpine sbatch` on a new connection (scancelled at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, corral_argv, print_table, time_command  # noqa: E402

MANAGED = {"resources": {"cpus": 1, "infra": "slurm/alpine"}, "run": "sleep 5"}
ANYWHERE = {"resources": {"cpus": 1}, "run": "sleep 5"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=40.0, help="how long cirrus stays frozen")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between ticks")
    parser.add_argument("--launches", type=int, default=6, help="`corral launch -d` calls at the end of the freeze")
    args = parser.parse_args()
    from testbed import Testbed

    bed = Testbed()
    with bench_testbed(bed) as bench:
        for key in ("CORRAL_SLURM_CONFIG", "CORRAL_HOME"):
            os.environ[key] = bench.env[key]
        from corral import managed
        from corral.client import Client
        from corral.controller.engine import Controller, ControllerSettings
        from corral.launch import Launcher
        from corral.state import open_store
        from corral.task import parse_task

        store = open_store()
        client = Client()
        live_squeue = time_command(bench.raw_ssh("alpine") + ["squeue --me -h"])

        async def scenario() -> tuple[list[float], dict[str, float], float, str | None]:
            launcher = Launcher(client, store)
            for cluster in bench.clusters:
                sleeper = {"resources": {"cpus": 1, "infra": f"slurm/{cluster}"}, "run": "sleep 600"}
                await launcher.launch(parse_task(sleeper, "sleeper"), "bench")
            controller = Controller(client, store, "bench", ControllerSettings(grace_seconds=3600))
            await controller.tick()
            ticks: list[float] = []
            seen_ended: dict[str, float] = {}
            bed.freeze_controller("cirrus")
            try:
                frozen_squeue = await asyncio.to_thread(
                    time_command, bench.raw_ssh("cirrus") + ["squeue --me -h"], None, False)
                [on_alpine] = managed.record(store, parse_task(MANAGED, "managed"), "bench")
                [anywhere] = managed.record(store, parse_task(ANYWHERE, "anywhere"), "bench")
                submitted = time.monotonic()
                until = submitted + args.seconds
                while time.monotonic() < until:
                    started = time.monotonic()
                    await controller.tick()
                    ticks.append(time.monotonic() - started)
                    for job_id in (on_alpine, anywhere):
                        if job_id not in seen_ended and store.managed([job_id])[0].state == "SUCCEEDED":
                            seen_ended[job_id] = time.monotonic() - submitted
                    await asyncio.sleep(args.interval)
            finally:
                bed.thaw_controller("cirrus")
            ran = store.attempts_of([anywhere]).get(anywhere, [])
            return ticks, {"alpine": seen_ended.get(on_alpine, float("nan")),
                           "anywhere": seen_ended.get(anywhere, float("nan"))}, frozen_squeue, \
                ran[-1].cluster if ran else None

        def queue_calls() -> tuple[list[float], list[float]]:
            time_command(corral_argv("server", "start"), bench.env)
            time_command(corral_argv("queue"), bench.env)  # the server has asked every cluster once
            launch = corral_argv("launch", "-d", "--cpus", "1", "--", "true")
            time_command(launch, bench.env)
            calls: list[float] = []
            launches: list[float] = []
            bed.freeze_controller("cirrus")
            try:
                until = time.monotonic() + args.seconds
                while time.monotonic() < until:
                    calls.append(time_command(corral_argv("queue"), bench.env))
                for _ in range(args.launches):
                    launches.append(time_command(launch, bench.env))
            finally:
                bed.thaw_controller("cirrus")
            return calls, launches

        try:
            ticks, seen_ended, frozen_squeue, ran_on = asyncio.run(scenario())
            calls, launches = queue_calls()
        finally:
            time_command(corral_argv("server", "stop"), bench.env, check=False)
            for cluster in bench.clusters:
                time_command(bench.raw_ssh(cluster) + ["scancel -u corral-test"], check=False)
    print_table(f"cirrus' slurmctld frozen for {args.seconds:g} s; a tick every {args.interval:g} s "
                f"({len(ticks)} ticks)", [
                    ("the first tick: places both (vs ssh cirrus squeue, frozen)", ticks[0], frozen_squeue, "-"),
                    ("tick wall time, median (vs ssh cirrus squeue, frozen)", statistics.median(ticks),
                     frozen_squeue, "-"),
                    ("tick wall time, longest (vs ssh cirrus squeue, frozen)", max(ticks), frozen_squeue, "-"),
                    ("managed `sleep 5` on alpine: submitted to seen SUCCEEDED (vs ssh alpine squeue)",
                     seen_ended["alpine"], live_squeue, "-"),
                    (f"managed `sleep 5` placed over 3 (ran on {ran_on}): submitted to seen SUCCEEDED "
                     "(vs ssh alpine squeue)", seen_ended["anywhere"], live_squeue, "-"),
                ])
    print_table(f"`corral queue` again and again, server up, cirrus frozen for {args.seconds:g} s "
                f"({len(calls)} calls; {sum(c > 1.0 for c in calls)} took over 1 s)", [
                    ("a call, median (vs ssh alpine squeue)", statistics.median(calls), live_squeue, "-"),
                    ("a call, longest (vs ssh cirrus squeue, frozen)", max(calls), frozen_squeue, "-"),
                ])
    baseline_launch = time_command(bench.raw_ssh("alpine", mux=False) + ["sbatch --hold --wrap true"])
    print_table(f"`corral launch -d --cpus 1 -- true` (placed over the 3 clusters) {len(launches)} times, "
                "cirrus still frozen", [
                    ("the first (vs ssh alpine sbatch, new connection)", launches[0], baseline_launch, "-"),
                    ("the others, median (vs ssh alpine sbatch, new connection)",
                     statistics.median(launches[1:]), baseline_launch, "-"),
                ])
    for which, seconds in seen_ended.items():
        if math.isnan(seconds):
            print(f"the managed job ({which}) was not seen to end while cirrus was frozen")


if __name__ == "__main__":
    main()
