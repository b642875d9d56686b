"""`corral sbatch` vs submitting the same script with plain `ssh <login> sbatch`, measured in the same run.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_sbatch.py
1. the first `corral sbatch` (it starts the server) and warm ones, pinned to one partition and placed
   over the three clusters, vs `ssh <login> sbatch < script` on a new connection (the script sent on
   stdin, as a user without Corral would) and over a ControlMaster;
2. `corral sbatch --dryrun` (a fresh probe, every cluster's rewritten script and diff), the table a
   person reads, vs one `ssh <login> sinfo` per cluster in parallel on new connections.
Every job is submitted held (`--hold` on the command line) so that nothing runs; all are cancelled.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, cancel_all, corral_argv, median_of, print_table, time_command  # noqa: E402

SCRIPT = """#!/bin/bash
#SBATCH --job-name=bench
#SBATCH --gres=gpu:h100:1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:10:00
#SBATCH -p gpu
#SBATCH --output=%x-%j.out

srun hostname
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    with bench_testbed() as bench:
        config, clusters, env = bench.config, bench.clusters, bench.env
        script = bench.scratch / "train.sh"
        script.write_text(SCRIPT)

        def raw(mux: bool) -> float:
            started = time.perf_counter()
            with script.open("rb") as stdin:
                subprocess.run([*bench.raw_ssh("alpine", mux=mux), "sbatch --parsable --hold"], stdin=stdin,
                               check=True, capture_output=True)
            return time.perf_counter() - started

        def sinfo_everywhere() -> float:
            started = time.perf_counter()
            with ThreadPoolExecutor(len(clusters)) as pool:
                list(pool.map(lambda c: subprocess.run([*bench.raw_ssh(c, mux=False), "sinfo"], check=True,
                                                       capture_output=True), clusters))
            return time.perf_counter() - started

        try:
            cancel_all(config, clusters)
            first = time_command(corral_argv("sbatch", "--hold", str(script)), env=env)  # starts the server
            raw_new = median_of(args.runs, lambda: raw(False))
            raw_mux = median_of(args.runs, lambda: raw(True))
            pinned = median_of(args.runs, lambda: time_command(
                corral_argv("sbatch", "--infra", "slurm/alpine/gpu", "--hold", str(script)), env=env))
            anywhere = median_of(args.runs, lambda: time_command(corral_argv("sbatch", "--hold", str(script)),
                                                                 env=env))
            dryrun = median_of(args.runs, lambda: time_command(corral_argv("sbatch", "--dryrun", str(script)),
                                                               env=env))
            sinfo = median_of(args.runs, sinfo_everywhere)
        finally:
            cancel_all(config, clusters)

    print_table(f"corral sbatch (median of {args.runs}; first call once)", [
        ("corral sbatch, first call: starts the server (vs ssh sbatch, new conn)", first, raw_new, "-"),
        ("corral sbatch --infra slurm/alpine/gpu (vs ssh sbatch, new conn)", pinned, raw_new, "-"),
        ("corral sbatch, placed over 3 clusters (vs ssh sbatch, new conn)", anywhere, raw_new, "-"),
        ("corral sbatch, placed over 3 clusters (vs ssh sbatch, mux)", anywhere, raw_mux, "-"),
        ("corral sbatch --dryrun: plan + 2 rewritten scripts (vs 3 ssh sinfo, parallel)", dryrun, sinfo, "-"),
    ])


if __name__ == "__main__":
    main()
