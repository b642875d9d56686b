"""The server's pass over ended jobs' files (run_files.py): N run directories with an env.sh on each of
the testbed's three clusters, whose attempts ended an hour ago, in a store that also holds H older
attempts already cleaned (history the pass must not pay for). Timed: the store's query alone; a
whole pass from a fresh client (new connections), against a raw `ssh CLUSTER rm -f …` of as many
files on a new connection per cluster, in parallel; then again with the client's connections open
(as a running server's are), against the raw ssh over a ControlMaster. Measured in the same run.
Also printed: the round trips per cluster, and that every env.sh is gone.

Run as root on a machine with the testbed:  python bench/bench_run_files.py [--dirs 1000] [--history 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, print_table  # noqa: E402


def make_dirs(ssh: list[str], tokens: list[str]) -> None:
    script = ('cd "$HOME" && for t in ' + " ".join(tokens)
              + '; do mkdir -p ".corral/runs/$t" && echo "TOKEN=secret" > ".corral/runs/$t/env.sh"; done')
    subprocess.run([*ssh, script], check=True, capture_output=True)


def count_env_files(ssh: list[str], tokens: list[str]) -> int:
    script = 'cd "$HOME" && n=0; for t in ' + " ".join(tokens) + '; do [ -e ".corral/runs/$t/env.sh" ] && n=$((n+1)); done; echo $n'
    return int(subprocess.run([*ssh, script], check=True, capture_output=True, text=True).stdout.strip())


def fill_store(store, clusters: dict[str, list[str]], history: int, ended_at: float) -> None:
    from corral.state.models import AttemptRow, JobRow, RunDirState

    jobs, attempts = [], []
    for cluster, tokens in clusters.items():
        for token in tokens:
            jobs.append(JobRow(id=f"c-{token}", name="bench", task_json="{}", created_at=ended_at))
            attempts.append(AttemptRow(token=token, job_id=f"c-{token}", cluster=cluster, partition="cpu",
                                       handle="1", state="SUCCEEDED", ended_at=ended_at,
                                       run_dir=f".corral/runs/{token}", log_path=f".corral/runs/{token}/log.txt"))
    for number in range(history):
        token = f"{number:012x}"
        jobs.append(JobRow(id=f"h-{token}", name="old", task_json="{}", created_at=ended_at - 86400))
        attempts.append(AttemptRow(token=f"h{token}", job_id=f"h-{token}", cluster="alpine", partition="cpu",
                                   handle="1", state="SUCCEEDED", ended_at=ended_at - 86400,
                                   run_dir=f".corral/runs/{token}", log_path="x",
                                   run_dir_state=RunDirState.ENV_REMOVED))
    store.add_jobs(jobs, attempts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dirs", type=int, default=1000, help="run directories per cluster")
    parser.add_argument("--history", type=int, default=100_000, help="older attempts, already cleaned")
    args = parser.parse_args()
    with bench_testbed() as bench:
        os.environ.update(CORRAL_SLURM_CONFIG=bench.config, CORRAL_HOME=bench.env["CORRAL_HOME"])
        from corral import run_files
        from corral.client import Client
        from corral.state import Store

        Path(bench.env["CORRAL_HOME"]).mkdir(parents=True, exist_ok=True)
        store = Store(f"sqlite:///{Path(bench.env['CORRAL_HOME']) / 'state.db'}")
        mux = {c: bench.raw_ssh(c) for c in bench.clusters}
        new = {c: bench.raw_ssh(c, mux=False) for c in bench.clusters}

        def raw_pass(ssh: dict[str, list[str]]) -> float:
            """The baseline, on directories of its own."""
            mine = {c: [secrets.token_hex(6) for _ in range(args.dirs)] for c in bench.clusters}
            for cluster, made in mine.items():
                make_dirs(mux[cluster], made)
            started = time.perf_counter()
            procs = [subprocess.Popen([*ssh[c], 'cd "$HOME" && rm -f -- '
                                       + " ".join(f".corral/runs/{t}/env.sh" for t in made)])
                     for c, made in mine.items()]
            assert all(p.wait() == 0 for p in procs)
            elapsed = time.perf_counter() - started
            for cluster, made in mine.items():
                subprocess.run([*mux[cluster], 'cd "$HOME"/.corral/runs && rm -rf -- ' + " ".join(made)], check=True)
            return elapsed

        def corral_pass(client: Client, history: int) -> tuple[float, float, object, int]:
            mine = {c: [secrets.token_hex(6) for _ in range(args.dirs)] for c in bench.clusters}
            for cluster, made in mine.items():
                make_dirs(mux[cluster], made)
            fill_store(store, mine, history, time.time() - 3600)
            started = time.perf_counter()
            store.ended_run_dirs(time.time() - run_files.GRACE, run_files.BATCH, clusters=bench.clusters[:1])
            query = time.perf_counter() - started
            started = time.perf_counter()
            report = asyncio.run(run_files.remove_env_files(client, store, time.time()))
            elapsed = time.perf_counter() - started
            left = sum(count_env_files(mux[c], made) for c, made in mine.items())
            for cluster, made in mine.items():
                subprocess.run([*mux[cluster], 'cd "$HOME"/.corral/runs && rm -rf -- ' + " ".join(made)], check=True)
            return query, elapsed, report, left

        raw_new = raw_pass(new)
        client = Client()
        query, first, report, left = corral_pass(client, args.history)
        trips = dict(client.transport.round_trips)
        raw_warm = raw_pass(mux)
        _, warm, warm_report, warm_left = corral_pass(client, 0)

    total = args.dirs * len(bench.clusters)
    print(f"\n{args.dirs} run directories on each of {len(bench.clusters)} clusters, {args.history} older attempts "
          f"already cleaned in the store")
    print(f"first pass: removed {report.removed}, errors {report.errors}, env.sh left {left} of {total}, "
          f"round trips {trips}")
    print(f"second pass: removed {warm_report.removed}, env.sh left {warm_left} of {total}")
    print_table("the pass (run_files.remove_env_files)", [
        ("store query: one cluster's batch of ended run directories", query, None, "-"),
        (f"a pass over {total} directories, new connections (vs raw ssh rm -f, new conn, parallel)",
         first, raw_new, "-"),
        (f"a pass over {total} directories, connections open (vs raw ssh rm -f over a master, parallel)",
         warm, raw_warm, "-"),
    ])


if __name__ == "__main__":
    main()
