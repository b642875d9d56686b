"""Server replicas on one PostgreSQL store: throughput with one, two and three, and the hand-over when one
is killed.

Run as root:  python bench/bench_replicas.py [--clusters 12] [--jobs 300] [--lease 10]
The scale mode's testbed (`--clusters` small Slurm clusters) and a private PostgreSQL are brought up.
For each number of replicas, on an emptied store: that many `corral server start --db postgresql://…`
(each its own CORRAL_HOME, ticking every second), then `--jobs` managed jobs (`true` on one CPU, placed
over every cluster) sent through the API round-robin over the replicas by 8 threads. Reported:
- how the clusters were split (each replica's count);
- jobs accepted per second, and jobs driven to SUCCEEDED per second (from the first request to the last
  job's end), against the same number of jobs sent raw (`sbatch --wrap true`, an equal part to each
  cluster) drained in the same run;
- exactly once: Slurm holds one record per attempt Corral made (a job moved while pending, to a
  cluster that could start it sooner, has two attempts: the first cancelled, held, before it ran);
- the replicas' CPU together, in cores, over the drain;
- with two or more: kill -9 the replica holding most clusters, and how long until the others hold every
  one of its clusters (against the lease period).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BenchSetup, bench_testbed, cpu_seconds, median_of, time_command  # noqa: E402

TASK = {"resources": {"cpus": 1}, "run": "true"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_replicas(bench: BenchSetup, url: str, count: int, lease: float, run: str) -> list[tuple[int, str, dict]]:
    """(pid, API URL, environment) of each replica started."""
    out = []
    for i in range(count):
        home = bench.scratch / f"home-{run}-{i}"
        home.mkdir(parents=True)
        (home / "config.yaml").write_text("submit_as: service\n")
        env = {**bench.env, "CORRAL_HOME": str(home), "CORRAL_CONTROLLER_INTERVAL": "1",
               "CORRAL_CONTROLLER_LEASE_SECONDS": str(lease)}
        port = free_port()
        subprocess.run([sys.executable, "-m", "corral", "server", "start", "--host", "127.0.0.1", "--port", str(port),
                        "--db", url], env=env, check=True, capture_output=True)
        pid = json.loads((home / "controller.json").read_text())["pid"]
        out.append((pid, f"http://127.0.0.1:{port}", env))
    return out


def holders(client) -> dict[str, int]:
    return {c: int(h.rsplit(":", 1)[1]) for c, h in client.health()["shards"]["clusters"].items()}


def wait_for(what: str, predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def run_once(bench: BenchSetup, url: str, count: int, jobs: int, lease: float) -> dict:
    from corral.sdk import Client
    from testbed import postgres

    postgres.empty(url)
    replicas = start_replicas(bench, url, count, lease, f"r{count}")
    pids = [pid for pid, _, _ in replicas]
    try:
        added = subprocess.run([sys.executable, "-m", "corral", "users", "add", "bench", "--json"],
                               env=replicas[0][2], check=True, capture_output=True, text=True)
        token = json.loads(added.stdout)["token"]
        clients = [Client(api, token) for _, api, _ in replicas]
        share = math.ceil(len(bench.clusters) / count)
        split = wait_for("the replicas to split the clusters", lambda: (
            h if set(h) == set(bench.clusters) and set(h.values()) == set(pids)
            and max(list(h.values()).count(pid) for pid in pids) <= share else None)
            if (h := holders(clients[0])) else None, timeout=60)
        since = time.strftime("%Y-%m-%dT%H:%M:%S")
        counts = sorted((list(split.values()).count(pid) for pid in pids), reverse=True)
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            ids = [j for batch in pool.map(lambda i: clients[i % count].managed_launch(TASK), range(jobs))
                   for j in batch]
        accepted = time.monotonic() - started

        def ended():
            listed, _ = clients[0].managed_jobs(all=True)
            mine = [j for j in listed if j.job_id in set(ids)]
            return mine if len(mine) == len(ids) and all(j.ended for j in mine) else None

        final = wait_for("every job to end", ended, timeout=1800, interval=1.0)
        drained = time.monotonic() - started
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
        states = {s: sum(1 for j in final if j.state == s) for s in {j.state for j in final}}
        attempts = sum(j.attempts for j in final)
        records = 0
        for cluster in bench.clusters:
            out = subprocess.run([*bench.raw_ssh(cluster), "squeue -h -t all -o '%j|%V'"], capture_output=True,
                                 text=True).stdout  # the scale clusters keep ended jobs a day (MinJobAge)
            records += sum(1 for line in out.splitlines()
                           if line.startswith("corral-") and line.rsplit("|", 1)[-1] >= since)
        result = {"replicas": count, "split": counts, "moves": sum(j.moves for j in final),
                  "accepted_per_s": jobs / accepted,
                  "drained_per_s": jobs / drained, "drain_s": drained, "states": states, "attempts": attempts,
                  "records": records, "cores": cpu / drained, "handover_s": None}
        if count >= 2:
            now_held = holders(clients[0])  # as it is now: shares may have moved during the drain
            victim = max(pids, key=lambda pid: list(now_held.values()).count(pid))
            lost = {c for c, pid in now_held.items() if pid == victim}
            survivor = clients[pids.index(next(p for p in pids if p != victim))]
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            wait_for("the survivors to take the dead replica's clusters", lambda: all(
                h.get(c) not in (None, victim) for c in lost) if (h := holders(survivor)) else False,
                timeout=4 * lease, interval=0.1)
            result["handover_s"] = time.monotonic() - killed
        return result
    finally:
        for pid, _, env in replicas:
            subprocess.run([sys.executable, "-m", "corral", "server", "stop"], env=env, capture_output=True)
        for cluster in bench.clusters:
            subprocess.run([*bench.raw_ssh(cluster), "scancel -u corral-test"], capture_output=True)


def drain_raw(bench: BenchSetup, jobs: int) -> float:
    """Slurm's own pace on these clusters: the jobs sent straight to them, until none is left in squeue."""
    per = -(-jobs // len(bench.clusters))
    started = time.monotonic()
    with ThreadPoolExecutor(len(bench.clusters)) as pool:
        list(pool.map(lambda c: subprocess.run(
            [*bench.raw_ssh(c), f"for i in $(seq {per}); do sbatch -Q -p cpu -n1 --wrap true; done"],
            check=True, capture_output=True), bench.clusters))

    def empty() -> bool:
        return all(not subprocess.run([*bench.raw_ssh(c), "squeue -h --me -t PD,R,CG"], capture_output=True,
                                      text=True).stdout.strip() for c in bench.clusters)

    wait_for("the raw jobs to drain", empty, timeout=1800, interval=1.0)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clusters", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    from testbed import postgres
    from testbed.bed import scale_testbed

    bed = scale_testbed(args.clusters)
    bed.down()  # from nothing: empty queues
    with bench_testbed(bed) as bench, postgres.postgres_server(port=47433) as url:
        raw_sbatch = median_of(5, lambda: time_command(
            [*bench.raw_ssh(bench.clusters[0], mux=False), "sbatch --parsable --hold -p cpu --wrap true"]))
        subprocess.run([*bench.raw_ssh(bench.clusters[0]), "scancel -u corral-test"], check=True)
        raw_drain = drain_raw(bench, args.jobs)
        results = [run_once(bench, url, count, args.jobs, args.lease) for count in args.replicas]
    print(f"\nreplicas on one PostgreSQL: {args.jobs} managed jobs of `true` over {args.clusters} clusters")
    print(f"baselines: raw ssh sbatch on a new connection {raw_sbatch:.3f} s; the same {args.jobs} jobs sent "
          f"raw (sbatch --wrap true, an equal part per cluster, one ssh each) drain in {raw_drain:.0f} s, "
          f"{args.jobs / raw_drain:.1f} jobs/s")
    print(f"{'replicas':>8} {'split':>10} {'accepted/s':>11} {'drained/s':>10} {'drain s':>8} {'cores':>6} "
          f"{'attempts':>9} {'moves':>6} {'records':>8} {'hand-over':>10}  end states")
    for r in results:
        handover = f"{r['handover_s']:.1f} s" if r["handover_s"] is not None else "-"
        print(f"{r['replicas']:>8} {'/'.join(map(str, r['split'])):>10} {r['accepted_per_s']:>11.1f} "
              f"{r['drained_per_s']:>10.1f} {r['drain_s']:>8.0f} {r['cores']:>6.2f} {r['attempts']:>9} "
              f"{r['moves']:>6} {r['records']:>8} {handover:>10}  {r['states']}")
    print(f"(hand-over: from kill -9 of the replica holding most clusters until the others hold all of them; "
          f"lease {args.lease:g} s)")


if __name__ == "__main__":
    main()
