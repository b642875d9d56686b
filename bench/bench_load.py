"""Sustained load through the API: jobs at a million a day for a while, with status queries alongside.

Run as root:  python bench/bench_load.py [--seconds 600] [--rate 11.6] [--clients 4]
The testbed is brought up from nothing (empty queues), and a server on it through the SDK, as a user
would. Each second, a submitter pool sends that second's share of the rate, mixed as every 30 jobs
are 16 single `launch -d` jobs, 4 managed jobs and one sweep of 10 (`num_jobs`); every task is `true`
on one CPU, placed over the three clusters. Meanwhile --clients threads each ask for the queue
and the managed jobs once a second. Reported:
- every job submitted exactly once: each Corral job's Slurm id exists, and Slurm holds as many Corral
  records submitted during the run as Corral made attempts (counted by job name, array tasks apart);
- latency of submissions and of status queries (p50, p99), against a raw `ssh <login> sbatch` on a
  new connection and a raw `ssh <login> squeue` over a ControlMaster, measured in the same run;
- the engine's CPU (the server process's user+system time over the run, in cores);
- each cluster's busiest minute against its RPC budget (sampled from /v1/health every 5 s).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, cpu_seconds, median_of, server_pid, time_command  # noqa: E402

TASK = {"resources": {"cpus": 1}, "run": "true"}
SWEEP = 10
# Every 30 jobs: 16 single launches, 4 managed jobs, one sweep of 10.
MIX = ("single",) * 4 + ("managed",) + ("single",) * 4 + ("sweep",) + ("single",) * 4 + ("managed",) + \
    ("single",) * 4 + ("managed",) * 2


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--rate", type=float, default=1_000_000 / 86_400, help="jobs a second")
    parser.add_argument("--clients", type=int, default=4, help="status-query clients")
    parser.add_argument("--submitters", type=int, default=8)
    args = parser.parse_args()
    from testbed import Testbed

    bed = Testbed()
    bed.down()  # from nothing: empty queues, so MaxJobCount holds this run's records
    with bench_testbed(bed) as bench:
        os.environ.update({k: bench.env[k] for k in ("CORRAL_SLURM_CONFIG", "CORRAL_HOME")})
        from corral.sdk import Client

        client = Client()
        client.health()  # starts the server
        pid = server_pid(Path(bench.env["CORRAL_HOME"]))
        raw_sbatch = median_of(5, lambda: time_command(
            [*bench.raw_ssh("alpine", mux=False), "sbatch --parsable --hold -p cpu --wrap true"]))
        raw_squeue = median_of(5, lambda: time_command([*bench.raw_ssh("alpine"), "squeue --me -h -t all"]))
        subprocess.run([*bench.raw_ssh("alpine"), "scancel -u corral-test"], check=True)
        started_iso = time.strftime("%Y-%m-%dT%H:%M:%S")
        lock = threading.Lock()
        submit_latency: list[float] = []
        status_latency: list[float] = []
        failures: list[str] = []
        job_ids: list[str] = []
        budget_peak: dict[str, tuple[int, int]] = {}
        stop = threading.Event()

        def submit(kind: str) -> None:
            began = time.perf_counter()
            try:
                if kind == "single":
                    ids = client.launch(TASK).job_ids
                elif kind == "sweep":
                    ids = client.launch(TASK, num_jobs=SWEEP).job_ids
                else:
                    ids = client.managed_launch(TASK)
            except Exception as exc:  # noqa: BLE001 - a benchmark counts failures, whatever they are
                with lock:
                    failures.append(f"{kind}: {exc}")
                return
            with lock:
                submit_latency.append(time.perf_counter() - began)
                job_ids.extend(ids)

        def status_client() -> None:
            while not stop.is_set():
                began = time.perf_counter()
                try:
                    client.queue(limit=20)
                    client.managed_jobs(limit=20)
                except Exception as exc:  # noqa: BLE001
                    with lock:
                        failures.append(f"status: {exc}")
                with lock:
                    status_latency.append((time.perf_counter() - began) / 2)
                stop.wait(1.0)

        def budget_sampler() -> None:
            while not stop.is_set():
                for cluster, used in (client.health().get("rpc_budget") or {}).items():
                    peak = budget_peak.get(cluster, (0, int(used["commands_per_minute"])))
                    budget_peak[cluster] = (max(peak[0], int(used["used_last_minute"])), peak[1])
                stop.wait(5.0)

        watchers = [threading.Thread(target=status_client) for _ in range(args.clients)]
        watchers.append(threading.Thread(target=budget_sampler))
        for thread in watchers:
            thread.start()
        cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
        owed = 0.0
        kinds = itertools.cycle(MIX)
        with ThreadPoolExecutor(args.submitters) as pool:
            for second in range(args.seconds):
                tick = wall_before + second
                owed += args.rate
                while owed >= 1:
                    kind = next(kinds)
                    owed -= SWEEP if kind == "sweep" else 1
                    pool.submit(submit, kind)
                time.sleep(max(0.0, tick + 1 - time.monotonic()))
        wall = time.monotonic() - wall_before
        cpu = cpu_seconds(pid) - cpu_before
        stop.set()
        for thread in watchers:
            thread.join()
        jobs = {j.job_id: j for j in client.queue_all()}
        deadline = time.monotonic() + 300
        # A managed job has no row in the queue until the controller gives it its first attempt.
        while any(j not in jobs or not jobs[j].slurm_job_id for j in job_ids) and time.monotonic() < deadline:
            time.sleep(2)  # managed jobs are submitted by the controller's next ticks
            jobs = {j.job_id: j for j in client.queue_all()}
        records: dict[str, set[str]] = {}
        counted = 0
        for cluster in bench.clusters:
            out = subprocess.run([*bench.raw_ssh(cluster), "squeue -h -r -t all -o '%i|%j|%V'"], capture_output=True,
                                 text=True, check=True).stdout
            lines = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
            ours = [(i, n) for i, n, v in lines if n.startswith("corral-") and v >= started_iso]
            records[cluster] = {i for i, _ in ours}
            counted += len(ours)
        missing = [j for j in job_ids if not (jobs.get(j) and jobs[j].slurm_job_id
                                              and jobs[j].slurm_job_id in records.get(jobs[j].cluster or "", ()))]
        attempts = sum(max(1, jobs[j].attempt) for j in job_ids if j in jobs)
        unsent = sum(1 for j in job_ids if j not in jobs)
        client.cancel(all=True)
    print(f"\nsustained load: {len(job_ids)} jobs in {wall:.0f} s ({len(job_ids) / wall:.1f} jobs/s, goal "
          f"{args.rate:.1f}); {args.clients} status clients at 1 query/s each")
    print(f"  exactly once: {len(job_ids) - len(missing)} of {len(job_ids)} jobs found in Slurm under their id; "
          f"Slurm holds {counted} Corral records from the run for {attempts} attempts; never submitted within 300 s "
          f"of the end: {unsent}; failures: {len(failures)}")
    for failure in failures[:5]:
        print(f"    {failure}")
    print(f"  engine CPU: {cpu:.1f} s over {wall:.0f} s = {cpu / wall:.2f} cores (goal < 1)")
    print(f"  submission latency: p50 {statistics.median(submit_latency):.3f} s, p99 "
          f"{percentile(submit_latency, 0.99):.3f} s (raw ssh sbatch, new connection: {raw_sbatch:.3f} s)")
    print(f"  status query latency: p50 {statistics.median(status_latency) * 1000:.0f} ms, p99 "
          f"{percentile(status_latency, 0.99) * 1000:.0f} ms (goal p99 <= 200 ms; raw ssh squeue, mux: "
          f"{raw_squeue * 1000:.0f} ms)")
    for cluster, (peak, limit) in sorted(budget_peak.items()):
        print(f"  {cluster}: busiest minute {peak} Slurm commands of a budget of {limit}")


if __name__ == "__main__":
    main()
