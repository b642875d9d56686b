"""A team server under a team's load: --users users each launching --per-user jobs at the same moment.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_team.py [--db URL]
A team server on loopback (SQLite under a scratch CORRAL_HOME, or --db), --users users added through
its admin, then users × per-user `launch -d` through the SDK at once, each placed over the three
clusters. Reports each launch's latency (p50, p99, max) against a raw `ssh <login> sbatch` on a new
connection measured in the same run, that every launch was accepted and submitted exactly once
(counted in Slurm by job name), and the SSH round trips of the server's ticks while those jobs are
live (the goal: one per cluster per tick, whatever the number of users). Every job is held and
cancelled at the end.

--submit-as (default sudo) is how the users' jobs reach Slurm (docs/team.md): the users are mapped in
turn to the testbed's members corral-alice and corral-bob on every cluster; with `ssh` each user's
key is authorized in their member's ~/.ssh/authorized_keys first (as root); `service` submits all as
the test user.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, cancel_all, corral_argv, median_of, print_table, time_command  # noqa: E402

MEMBERS = ("corral-alice", "corral-bob")  # the testbed's team members
HELD_TASK = {"resources": {"cpus": 1}, "slurm": {"sbatch_args": ["--hold"]}, "run": "true"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--per-user", type=int, default=10)
    parser.add_argument("--runs", type=int, default=7, help="runs of the raw baseline")
    parser.add_argument("--db", help="the team server's store (default: SQLite in a scratch home)")
    parser.add_argument("--submit-as", choices=["sudo", "ssh", "service"], default="sudo")
    args = parser.parse_args()
    from corral.sdk import Client

    with bench_testbed() as bench:
        config, clusters = bench.config, bench.clusters
        home = bench.scratch / "team-home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.yaml").write_text(f"submit_as: {args.submit_as}\n")
        env = {**bench.env, "CORRAL_HOME": str(home)}
        cancel_all(config, clusters)
        _cancel_members(clusters)
        raw_new = median_of(args.runs, lambda: time_command(
            [*bench.raw_ssh("alpine", mux=False), "sbatch --parsable --hold -p cpu --wrap true"]))
        port = _free_port()
        start = corral_argv("server", "start", "--host", "127.0.0.1", "--port", str(port),
                            *(["--db", args.db] if args.db else []))
        subprocess.run(start, env=env, check=True, capture_output=True)
        url = f"http://127.0.0.1:{port}"
        try:
            tokens = []
            for i in range(args.users):
                member = MEMBERS[i % len(MEMBERS)]
                mapping = [a for c in clusters for a in ("--unix-user", f"{c}={member}")]
                added = subprocess.run(corral_argv("users", "add", f"user{i:02d}", "--json", *mapping), env=env,
                                       check=True, capture_output=True, text=True)
                tokens.append(json.loads(added.stdout)["token"])
                if args.submit_as == "ssh":
                    _authorize(member, Client(url, tokens[-1]).me()["ssh_public_key"])
            Client(url, tokens[0]).check()  # ControlMasters open, as on a server that has been up a while
            latencies, failures, job_ids = _burst(url, tokens, args.per_user)
            names = _slurm_names(config, clusters)
            ticks = _tick_round_trips(url, tokens[0])
        finally:
            cancel_all(config, clusters)
            _cancel_members(clusters)
            subprocess.run(corral_argv("server", "stop"), env=env, capture_output=True)
            for member in MEMBERS:
                (Path("/home") / member / ".ssh" / "authorized_keys").unlink(missing_ok=True)
    total = args.users * args.per_user
    latencies.sort()
    p50, p99 = statistics.median(latencies), latencies[max(0, int(len(latencies) * 0.99) - 1)]
    print_table(f"{total} launches at once ({args.users} users x {args.per_user}, submit_as: {args.submit_as}), "
                f"each `launch -d` placed over 3 clusters (baseline: ssh sbatch, new connection, median of "
                f"{args.runs})", [
                    ("launch latency p50", p50, raw_new, "-"),
                    ("launch latency p99", p99, raw_new, "-"),
                    ("launch latency max", latencies[-1], raw_new, "-"),
                ])
    print(f"\naccepted {len(latencies)}/{total}; {len(failures)} failed"
          + (f" (e.g. {failures[0]})" if failures else "")
          + f"; {len(set(job_ids))} distinct jobs; {len(set(names))} job names in Slurm, "
            f"{len(names) - len(set(names))} twice")
    print(f"SSH round trips of the server's ticks with them live: {ticks} (goal: 1 per cluster per tick)")


def _burst(url: str, tokens: list[str], per_user: int) -> tuple[list[float], list[str], list[str]]:
    from corral.sdk import Client

    latencies: list[float] = []
    failures: list[str] = []
    job_ids: list[str] = []
    lock = threading.Lock()
    gate = threading.Barrier(len(tokens) * per_user)

    def one(token: str) -> None:
        client = Client(url, token, timeout=600)
        gate.wait()
        started = time.perf_counter()
        try:
            launched = client.launch(HELD_TASK)
        except Exception as exc:  # noqa: BLE001 - counted and shown, the benchmark goes on
            with lock:
                failures.append(str(exc))
            return
        with lock:
            latencies.append(time.perf_counter() - started)
            job_ids.extend(launched.job_ids)

    threads = [threading.Thread(target=one, args=(token,)) for token in tokens for _ in range(per_user)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, failures, job_ids


def _tick_round_trips(url: str, token: str) -> list[dict[str, int]]:
    """The round trips of the next three ticks (each read from the server's health)."""
    from corral.sdk import Client

    client = Client(url, token)
    seen: list[dict[str, int]] = []
    last = None
    deadline = time.monotonic() + 120
    while len(seen) < 3 and time.monotonic() < deadline:
        tick = client.health()["last_tick"]
        if tick and tick["at"] != last:
            last = tick["at"]
            seen.append(tick["round_trips"])
        time.sleep(0.5)
    return seen


def _slurm_names(config: str, clusters: list[str]) -> list[str]:
    names: list[str] = []
    for cluster in clusters:
        out = subprocess.run(["ssh", "-F", config, cluster, f"squeue -h -u corral-test,{','.join(MEMBERS)} -o %j"],
                             capture_output=True, text=True).stdout
        names += [line for line in out.split() if line.startswith("corral-")]
    return names


def _authorize(member: str, key: str) -> None:
    """What the member does once: the server's key for that user, in their authorized_keys."""
    ssh_dir = Path("/home") / member / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    with open(ssh_dir / "authorized_keys", "a") as keys:
        keys.write(key + "\n")
    (ssh_dir / "authorized_keys").chmod(0o600)
    subprocess.run(["chown", "-R", f"{member}:{member}", str(ssh_dir)], check=True)


def _cancel_members(clusters: list[str]) -> None:
    """The members' jobs, cancelled as root (Slurm's admin) with each cluster's config."""
    from testbed import Testbed

    bed = Testbed()
    for cluster in clusters:
        for member in MEMBERS:  # scancel takes one user
            subprocess.run(["scancel", "-u", member], env=bed.slurm_env(cluster), capture_output=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    os.umask(0o077)
    main()
