"""`corral queue` over a long history: 100,000 ended jobs (and one 1,000-job sweep) in the store.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_queue.py [--jobs N]
Times what a person runs, the table (`corral queue`), `--json` and squeue's filters (`-t`,
`--name`), and the peak memory of the command, each a fresh process (so the first call is what is
measured). The baseline is what a user
would otherwise type: `ssh <login> squeue --me` on a new connection.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, corral_argv, median_of, print_table, time_command  # noqa: E402


def seed(home: Path, jobs: int) -> None:
    """A new CORRAL_HOME whose store holds `jobs` ended jobs and a 1,000-job sweep."""
    from sqlalchemy import insert

    from corral.state import Store
    from corral.state.models import AttemptRow, JobRow

    home.mkdir(mode=0o700, parents=True)
    store = Store(f"sqlite:///{home / 'state.db'}")
    start = time.time() - 86400 * 30
    job_rows = [{"id": f"c-{i:012x}", "name": f"job{i}", "task_json": "{}", "created_at": start + i * 20, "sweep_id": None,
                 "job_rank": 0, "num_jobs": 1} for i in range(jobs)]
    job_rows += [{"id": f"c-f{i:011x}", "name": "sweep", "task_json": "{}", "created_at": start + jobs * 20,
                  "job_rank": i, "num_jobs": 1000, "sweep_id": "c-f00000000000"} for i in range(1000)]
    attempts = [{"token": f"t{r['id']}", "job_id": r["id"], "number": 1, "cluster": "alpine", "partition": "gpu",
                 "state": "SUCCEEDED", "created_at": r["created_at"], "run_dir": "r", "log_path": "l",
                 "handle": str(n), "submitted_at": r["created_at"], "started_at": r["created_at"] + 2,
                 "ended_at": r["created_at"] + 10} for n, r in enumerate(job_rows)]
    with store.engine.begin() as conn:
        conn.execute(insert(JobRow), job_rows)
        conn.execute(insert(AttemptRow), attempts)


def peak_rss_mb(argv: list[str], env: dict[str, str]) -> float:
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True).stdout
    return int(out.strip()) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with bench_testbed() as bench:
        home = Path(bench.env["CORRAL_HOME"])
        seed(home, args.jobs)
        env = bench.env
        table = median_of(args.runs, lambda: time_command(corral_argv("queue"), env=env))
        as_json = median_of(args.runs, lambda: time_command(corral_argv("queue", "--json"), env=env))
        page = median_of(args.runs, lambda: time_command(corral_argv("queue", "--page", "100"), env=env))
        # squeue's filters (GET /v1/jobs): a page of the matches, and how many there are
        ended = median_of(args.runs, lambda: time_command(corral_argv("queue", "-t", "CD"), env=env))
        failed = median_of(args.runs, lambda: time_command(corral_argv("queue", "-t", "F,CA"), env=env))
        named = median_of(args.runs, lambda: time_command(corral_argv("queue", "--name", "job9999"), env=env))
        raw = median_of(args.runs, lambda: time_command([*bench.raw_ssh("alpine", mux=False), "squeue --me"]))
        memory = peak_rss_mb(corral_argv("queue"), env)
        all_memory = peak_rss_mb(corral_argv("queue", "--all", "--json"), env)
        started = time.perf_counter()
        subprocess.run(corral_argv("queue", "--all", "--json"), env=env, stdout=subprocess.DEVNULL, check=True)
        everything = time.perf_counter() - started
    print_table(f"corral queue with {args.jobs:,} ended jobs and a 1,000-job sweep (median of {args.runs})", [
        ("queue (the table: 20 rows, a sweep as one) vs ssh squeue, new conn", table, raw, "<= 0.3 s"),
        ("queue --json (20 jobs) vs ssh squeue, new conn", as_json, raw, "-"),
        ("queue --page 100 (rows 1,981-2,000)", page, raw, "-"),
        (f"queue -t CD (20 of {args.jobs + 1000:,} matches, counted)", ended, raw, "-"),
        ("queue -t F,CA (no match)", failed, raw, "-"),
        ("queue --name job9999 (a name part: 11 matches)", named, raw, "-"),
        (f"queue --all --json ({args.jobs + 1000:,} jobs, streamed)", everything, None, "-"),
    ])
    print(f"peak memory: queue {memory:.0f} MB, queue --all --json {all_memory:.0f} MB")


if __name__ == "__main__":
    main()
