"""A sweep of short tasks, drained: `corral launch -d --num-jobs N -- true` pinned to alpine's `cpu`
partition (one node, 32 CPUs) against a raw `sbatch --array=0-(N-1) --wrap true` there, each timed from
the submission to the last task's end, measured in the same run.

Run as root on a machine with the testbed:  python bench/bench_drain.py [--tasks 1000]
What differs: a Corral task runs its wrapper (`task.sh`: the cancel fence, setup and run with the
task's env); a single-node task runs it in the batch step itself, with no srun step.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, cancel_all, corral_argv, print_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=1000)
    args = parser.parse_args()
    with bench_testbed() as bench:
        ssh = bench.raw_ssh("alpine")

        def live() -> int:
            out = subprocess.run([*ssh, "squeue -h -u corral-test -t PENDING,RUNNING,CONFIGURING,COMPLETING -r "
                                        "-o %i | wc -l"], capture_output=True, text=True, check=True).stdout
            return int(out.strip() or 0)

        def drained(started: float) -> float:
            while live():
                time.sleep(0.5)
            return time.perf_counter() - started

        cancel_all(bench.config, ["alpine"])
        started = time.perf_counter()
        # Each task writes its output file, as a Corral task writes its log; removed after the run.
        raw_id = subprocess.run([*ssh, f"sbatch --parsable -p cpu --array=0-{args.tasks - 1} --wrap true"],
                                check=True, capture_output=True, text=True).stdout.strip()
        raw = drained(started)
        subprocess.run([*ssh, f"rm -f ~/slurm-{int(raw_id.split(';')[0])}_*.out"], check=True)
        started = time.perf_counter()
        subprocess.run(corral_argv("launch", "-d", "--num-jobs", str(args.tasks), "--infra", "slurm/alpine/cpu",
                                   "--", "true"), env=bench.env, check=True, capture_output=True)
        corral = drained(started)
        cancel_all(bench.config, ["alpine"])
    print_table(f"a sweep of {args.tasks} tasks of `true` on alpine/cpu, submitted to drained (one run each)",
                [("corral launch -d --num-jobs (vs sbatch --array --wrap true)", corral, raw, "<= 1.2x")])


if __name__ == "__main__":
    main()
