"""A managed pipeline of short tasks, against what a Slurm user writes for it: a chain of `sbatch
--dependency=afterok:<previous>` jobs on the same cluster. Both are `true` on alpine's `cpu` partition,
timed from the submission to the last task's end, measured in the same run.

Run as root on a machine with the testbed:  python bench/bench_pipeline.py [--tasks 3] [--runs 3]
What differs: Slurm starts a dependent job in its own scheduling pass once the one before it ended;
Corral submits each task only once the controller has seen the one before it succeed (one tick at the
server's pace, `CORRAL_CONTROLLER_INTERVAL`), so each task after the first costs a tick and a
submission. Also printed: the gap between a task's end and the next one's submission, from the store.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, cancel_all, corral_argv, print_table, wait_managed_ended  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with bench_testbed() as bench:
        ssh = bench.raw_ssh("alpine")
        pipeline = bench.scratch / "pipeline.yaml"
        pipeline.write_text("name: bench\n" + "".join(
            f"---\nname: t{i}\nresources:\n  infra: slurm/alpine/cpu\n  cpus: 1\nrun: 'true'\n"
            for i in range(args.tasks)))

        def live() -> int:
            out = subprocess.run([*ssh, "squeue -h -u corral-test -t PENDING,RUNNING,CONFIGURING,COMPLETING -o %i "
                                        "| wc -l"], capture_output=True, text=True, check=True).stdout
            return int(out.strip() or 0)

        def raw_chain() -> float:
            script = "prev=$(sbatch --parsable -p cpu -c 1 -o /dev/null --wrap true)\n" + "".join(
                "prev=$(sbatch --parsable -p cpu -c 1 -o /dev/null --dependency=afterok:$prev --wrap true)\n"
                for _ in range(args.tasks - 1))
            started = time.perf_counter()
            subprocess.run([*ssh, script], check=True, capture_output=True)
            while live():
                time.sleep(0.1)
            return time.perf_counter() - started

        gaps: list[float] = []

        def corral_pipeline() -> float:
            started = time.perf_counter()
            launched = subprocess.run(corral_argv("jobs", "launch", "-d", "--json", str(pipeline)), env=bench.env,
                                      check=True, capture_output=True, text=True)
            ids = json.loads(launched.stdout)["job_ids"]
            states = wait_managed_ended(bench.env, ids)
            elapsed = time.perf_counter() - started
            if any(states[i] != "SUCCEEDED" for i in ids):
                raise SystemExit(f"the pipeline did not succeed: {states}")
            attempts = [_first_attempt(bench.env, i) for i in ids]
            gaps.extend(b["submitted_at"] - a["ended_at"] for a, b in zip(attempts, attempts[1:]))
            return elapsed

        cancel_all(bench.config, ["alpine"])
        raw_chain()  # warm the login node and Slurm's scheduler once
        raw = statistics.median(raw_chain() for _ in range(args.runs))
        corral_pipeline()  # starts the server and its ControlMasters
        gaps.clear()
        corral = statistics.median(corral_pipeline() for _ in range(args.runs))
        cancel_all(bench.config, ["alpine"])
    print_table(f"a pipeline of {args.tasks} tasks of `true` on alpine/cpu, submitted to the last end "
                f"(median of {args.runs})",
                [("corral jobs launch -d pipeline.yaml (vs sbatch --dependency=afterok chain)", corral, raw, "-")])
    print(f"a task's end to the next task's submission (Slurm's whole-second end time): median "
          f"{statistics.median(gaps):.2f} s, max {max(gaps):.2f} s over {len(gaps)} hand-overs")


def _first_attempt(env: dict[str, str], job_id: str) -> dict:
    """A managed job's first attempt, from the server `env` names (its CORRAL_HOME)."""
    code = ("import json, sys; from corral.sdk import Client; "
            "print(json.dumps(Client().managed_job(sys.argv[1])['attempt_list'][0]))")
    out = subprocess.run([sys.executable, "-c", code, job_id], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


if __name__ == "__main__":
    main()
