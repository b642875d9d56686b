"""`corral jobs queue` answered by the running controller's API vs read from the store, same run.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_cli_api.py
N managed jobs (held in Slurm, so nothing runs) in a fresh Corral home. With the controller up,
`jobs queue` asks its loopback API and loads neither SQLAlchemy nor pydantic; with it down, the
command reads the store itself. The baseline is what a user would otherwise type: `ssh <login>
squeue --me` over a ControlMaster, for one cluster.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, corral_argv, median_of, print_table, time_command  # noqa: E402

HELD = "resources:\n  cpus: 1\nslurm:\n  sbatch_args: [--hold]\nrun: 'true'\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    with bench_testbed() as bench:
        task = bench.scratch / "held.yaml"
        task.write_text(HELD)
        env = {**bench.env, "CORRAL_CONTROLLER_INTERVAL": "5"}
        subprocess.run(corral_argv("jobs", "launch", "--num-jobs", str(args.jobs), str(task)), env=env,
                       check=True, capture_output=True)
        try:
            deadline = time.monotonic() + 120
            while '"slurm_job_id": null' in subprocess.run(corral_argv("jobs", "queue", "--json"), env=env,
                                                           capture_output=True, text=True).stdout:
                if time.monotonic() > deadline:
                    raise SystemExit("the controller did not submit the jobs")
                time.sleep(0.5)
            queue = corral_argv("jobs", "queue", "--json")
            via_api = median_of(args.runs, lambda: time_command(queue, env=env))
            subprocess.run(corral_argv("server", "stop"), env=env, check=True, capture_output=True)
            from_store = median_of(args.runs, lambda: time_command(queue, env=env))
            raw = median_of(args.runs, lambda: time_command([*bench.raw_ssh("alpine"), "squeue --me"]))
        finally:
            subprocess.run(corral_argv("server", "stop"), env=env, capture_output=True)
            for cluster in bench.clusters:
                subprocess.run([*bench.raw_ssh(cluster), "scancel -u corral-test"], capture_output=True)
    print_table(f"corral jobs queue with {args.jobs} managed jobs (median of {args.runs})", [
        ("jobs queue --json, controller up: its API (vs ssh squeue --me, mux)", via_api, raw, "-"),
        ("jobs queue --json, controller down: the store (vs ssh squeue, mux)", from_store, raw, "-"),
    ])


if __name__ == "__main__":
    main()
