"""The server as the one engine: launch latency warm and cold, many launches at once, memory at scale.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_server.py
1. `corral launch -d` with the server running, and the first call that starts it, against a raw
   `ssh <login> sbatch` on a new connection (medians of --runs); a fresh probe every time. The first
   call twice: with the server stopped (its store and ControlMasters left from before), and a person's
   very first (a new CORRAL_HOME: no store, no masters);
2. --concurrent `corral launch -d` started at the same moment on a fresh store: all accepted, each job
   submitted exactly once (counted in Slurm by its token), one engine process;
3. the server's resident memory with --managed managed jobs live (held sweeps of up to 10,000, so
   nothing runs); `--memory-only` measures this part alone (`--managed 100000` for the larger goal).
Every benchmark job is held (`--hold`) and cancelled at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    bench_testbed,
    cancel_all,
    close_masters,
    corral_argv,
    median_of,
    print_table,
    time_command,
)
from corral.taskfile import MAX_SWEEP_JOBS  # noqa: E402

HELD_TASK = "resources:\n  cpus: 1\nslurm:\n  sbatch_args: [--hold]\nrun: 'true'\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--concurrent", type=int, default=50)
    parser.add_argument("--managed", type=int, default=10_000)
    parser.add_argument("--memory-only", action="store_true", help="part 3 alone")
    args = parser.parse_args()
    with bench_testbed() as bench:
        config, clusters = bench.config, bench.clusters
        task = bench.scratch / "held.yaml"
        task.write_text(HELD_TASK)
        env = bench.env
        if args.memory_only:
            try:
                rss_idle, rss_loaded, live = _memory(args.managed, task, env)
            finally:
                cancel_all(config, clusters)
            _print_memory(rss_idle, rss_loaded, live)
            return
        try:
            cancel_all(config, clusters)
            raw_new = median_of(args.runs, lambda: time_command(
                [*bench.raw_ssh("alpine", mux=False), "sbatch --parsable --hold -p cpu --wrap true"]))
            launch = corral_argv("launch", "-d", "--infra", "slurm/alpine/cpu", str(task))
            anywhere = corral_argv("launch", "-d", str(task))
            time_command(corral_argv("check"), env=env)  # the server up, its ControlMasters open
            warm_pinned = median_of(args.runs, lambda: time_command(launch, env=env))
            warm_any = median_of(args.runs, lambda: time_command(anywhere, env=env))

            def cold() -> float:
                subprocess.run(corral_argv("server", "stop"), env=env, capture_output=True, check=True)
                return time_command(launch, env=env)

            cold_pinned = median_of(args.runs, cold, warmup=0)
            homes = iter(range(10**6))

            def first_ever() -> float:
                home = bench.scratch / "first" / f"home-{next(homes)}"
                seconds = time_command(launch, env={**env, "CORRAL_HOME": str(home)})
                close_masters(home.parent)
                return seconds

            first_pinned = median_of(args.runs, first_ever, warmup=0)
            cancel_all(config, clusters)

            fresh = {**env, "CORRAL_HOME": str(bench.scratch / "home-concurrent")}
            burst, accepted, submitted, engines = _burst(args.concurrent, task, fresh, config, clusters)
            cancel_all(config, clusters)

            managed_env = {**env, "CORRAL_HOME": str(bench.scratch / "home-managed")}
            rss_idle, rss_loaded, live = _memory(args.managed, task, managed_env)
        finally:
            cancel_all(config, clusters)

    print_table(f"launch -d through the server (median of {args.runs}; baseline: ssh sbatch, new connection)", [
        ("corral launch -d --infra slurm/alpine/cpu, server running", warm_pinned, raw_new, "<= 1.0x"),
        ("corral launch -d, placed over 3 clusters, server running", warm_any, raw_new, "<= 1.0x"),
        ("corral launch -d --infra slurm/alpine/cpu, first call (starts it)", cold_pinned, raw_new, "<= 3x"),
        ("corral launch -d --infra slurm/alpine/cpu, first call in a new home", first_pinned, raw_new, "-"),
    ])
    print(f"\n{args.concurrent} `corral launch -d` at once on a fresh store: {burst:.2f} s for all; "
          f"{accepted} accepted, {submitted} jobs in Slurm, {engines} engine process(es) "
          f"(goal: {args.concurrent}, {args.concurrent}, 1)")
    _print_memory(rss_idle, rss_loaded, live)


def _print_memory(idle: float, loaded: float, live: int) -> None:
    print(f"server memory: {idle:.0f} MB idle, {loaded:.0f} MB with {live} live managed jobs "
          f"(goal <= 150 MB with 10,000, <= 500 MB with 100,000)")


def _burst(n: int, task: Path, env: dict[str, str], config: str, clusters: list[str]) -> tuple[float, int, int, int]:
    argv = corral_argv("launch", "-d", "--json", str(task))
    started = time.perf_counter()
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    outs = [p.communicate(timeout=600) for p in procs]
    elapsed = time.perf_counter() - started
    accepted = [json.loads(out) for (out, _err), p in zip(outs, procs) if p.returncode == 0]
    failed = [err.strip() for (_out, err), p in zip(outs, procs) if p.returncode != 0]
    if failed:
        print(f"  {len(failed)} failed, e.g.: {failed[0]}")
    names: list[str] = []
    for cluster in clusters:
        out = subprocess.run(["ssh", "-F", config, cluster, "squeue -h -u corral-test -o %j"],
                             capture_output=True, text=True).stdout
        names += [line for line in out.split() if line.startswith("corral-")]
    duplicates = len(names) - len(set(names))
    if duplicates:
        print(f"  {duplicates} job names appear twice in Slurm")
    return elapsed, len(accepted), len(set(names)), _engines(env["CORRAL_HOME"])


def _engines(home: str) -> int:
    """Server processes of this CORRAL_HOME (their environment names it)."""
    count = 0
    for proc in Path("/proc").iterdir():
        try:
            if b"corral.controller" in (proc / "cmdline").read_bytes() and \
                    f"CORRAL_HOME={home}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                count += 1
        except OSError:
            continue
    return count


def _memory(n: int, task: Path, env: dict[str, str]) -> tuple[float, float, int]:
    subprocess.run(corral_argv("queue"), env=env, check=True, capture_output=True)
    pid = _server_pid(env)
    idle = _rss_mb(pid)
    for start in range(0, n, MAX_SWEEP_JOBS):  # sweeps no larger than a sweep may be
        subprocess.run(corral_argv("jobs", "launch", "--num-jobs", str(min(MAX_SWEEP_JOBS, n - start)), str(task)),
                       env=env, check=True, capture_output=True)
    deadline = time.monotonic() + 900
    live = 0
    while time.monotonic() < deadline:  # until the controller has submitted them all
        rows = json.loads(subprocess.run(corral_argv("jobs", "queue", "--json", "--all"), env=env, check=True,
                                         capture_output=True, text=True).stdout)
        live = sum(1 for r in rows if r["state"] == "PENDING")
        if live == n:
            break
        time.sleep(5)
    for _ in range(3):  # a few ticks with all of them tracked
        subprocess.run(corral_argv("queue", "--limit", "5"), env=env, check=True, capture_output=True)
        time.sleep(5)
    loaded = _rss_mb(pid)
    subprocess.run(corral_argv("jobs", "cancel", "--all"), env=env, capture_output=True)
    return idle, loaded, live


def _server_pid(env: dict[str, str]) -> int:
    return int((Path(env["CORRAL_HOME"]) / "controller.pid").read_text().split()[0])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


if __name__ == "__main__":
    os.umask(0o077)
    main()
