"""A job group (a primary task and an auxiliary server task), against what a Slurm user writes for it:
both jobs submitted at once on the same cluster, and a third job, `--dependency=afterany:<primary>`,
that scancels the server once the primary has ended. Both on alpine's `cpu` partition: the primary
runs `sleep 1`, the server `sleep 600`; timed from the submission until every job has ended, and
until both have started (the later of Slurm's two start times, whole seconds, for both sides). Measured
in the same run.

Run as root on a machine with the testbed:  python bench/bench_jobgroup.py [--runs 3]
What differs: Corral places the group on its controller's next tick (woken at once by the launch),
and stops the server on the tick that sees the primary end (one tick at the server's pace,
`CORRAL_CONTROLLER_INTERVAL`); Slurm starts the scancel job in its own scheduling pass. Also printed:
the gap between the primary's end and the server's end, from the store.
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

from bench.bench_pipeline import _first_attempt  # noqa: E402
from bench.common import bench_testbed, cancel_all, corral_argv, print_table, wait_managed_ended  # noqa: E402

GROUP = """\
name: bench-group
execution: parallel
primary_tasks: [primary]
---
name: server
resources: {infra: slurm/alpine/cpu, cpus: 1}
run: sleep 600
---
name: primary
resources: {infra: slurm/alpine/cpu, cpus: 1}
run: sleep 1
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with bench_testbed() as bench:
        ssh = bench.raw_ssh("alpine")
        group = bench.scratch / "group.yaml"
        group.write_text(GROUP)

        def squeue(states: str) -> int:
            out = subprocess.run([*ssh, f"squeue -h -u corral-test -t {states} -o %i | wc -l"],
                                 capture_output=True, text=True, check=True).stdout
            return int(out.strip() or 0)

        def raw_group() -> tuple[float, float]:
            script = ("a=$(sbatch --parsable -p cpu -c 1 -o /dev/null --wrap 'sleep 1')\n"
                      "b=$(sbatch --parsable -p cpu -c 1 -o /dev/null --wrap 'sleep 600')\n"
                      "sbatch --parsable -p cpu -c 1 -o /dev/null --dependency=afterany:$a --wrap \"scancel $b\"\n"
                      "echo $a,$b\n")
            submitted, started = time.time(), time.perf_counter()
            ids = subprocess.run([*ssh, script], check=True, capture_output=True, text=True).stdout.split()[-1]
            while squeue("PENDING,RUNNING,CONFIGURING,COMPLETING"):
                time.sleep(0.1)
            elapsed = time.perf_counter() - started
            starts = subprocess.run([*ssh, f"squeue -h -t all -j {ids} -o %S | xargs -n1 date +%s -d"],
                                    check=True, capture_output=True, text=True).stdout.split()
            return elapsed, max(float(s) for s in starts) - submitted

        gaps: list[float] = []

        def corral_group() -> tuple[float, float]:
            submitted, started = time.time(), time.perf_counter()
            launched = subprocess.run(corral_argv("jobs", "launch", "-d", "--json", str(group)), env=bench.env,
                                      check=True, capture_output=True, text=True)
            ids = json.loads(launched.stdout)["job_ids"]
            states = wait_managed_ended(bench.env, ids)
            elapsed = time.perf_counter() - started
            if [states[i] for i in ids] != ["CANCELLED", "SUCCEEDED"]:
                raise SystemExit(f"the group did not end as expected: {states}")
            server, primary = (_first_attempt(bench.env, i) for i in ids)
            gaps.append(server["ended_at"] - primary["ended_at"])
            return elapsed, max(server["started_at"], primary["started_at"]) - submitted

        cancel_all(bench.config, ["alpine"])
        raw_group()  # warm the login node and Slurm's scheduler once
        raw = [raw_group() for _ in range(args.runs)]
        corral_group()  # starts the server and its ControlMasters
        gaps.clear()
        corral = [corral_group() for _ in range(args.runs)]
        cancel_all(bench.config, ["alpine"])
    print_table(f"a job group (primary `sleep 1`, auxiliary `sleep 600`) on alpine/cpu (median of {args.runs})", [
        ("submitted to both started, Slurm's start times (vs two sbatch)", statistics.median(c[1] for c in corral),
         statistics.median(r[1] for r in raw), "-"),
        ("submitted to every task ended (vs sbatch + afterany scancel job)", statistics.median(c[0] for c in corral),
         statistics.median(r[0] for r in raw), "-")])
    print(f"the primary's end to the server's end (Slurm's whole-second end times): median "
          f"{statistics.median(gaps):.2f} s, max {max(gaps):.2f} s over {len(gaps)} runs")


if __name__ == "__main__":
    main()
