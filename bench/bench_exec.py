"""Dev allocations: `corral exec NAME -- true` and `ssh NAME true` (the alias, through a per-connection
sshd on the head node) vs raw `ssh <login> srun --jobid … --overlap true`, in the same run.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_exec.py
The allocation is a 1-node CPU allocation on alpine. `corral exec` and the mux baseline run over
ControlMasters that are already up; `ssh NAME` makes a new SSH connection to the head node's sshd
each time (its ProxyCommand reuses Corral's ControlMaster to the login node), so it is also compared
with the raw command over a new connection.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_testbed, corral_argv, median_of, print_table, time_command  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    with bench_testbed() as bench:
        up = subprocess.run(corral_argv("launch", "-c", "bench", "--infra", "slurm/alpine/cpu", "--json"),
                            env=bench.env, capture_output=True, text=True, check=True)
        job = json.loads(up.stdout)["slurm_job_id"]
        try:
            raw = median_of(args.runs, lambda: time_command(
                [*bench.raw_ssh("alpine"), f"srun --jobid={job} --overlap true"]))
            raw_new = median_of(args.runs, lambda: time_command(
                [*bench.raw_ssh("alpine", mux=False), f"srun --jobid={job} --overlap true"]))
            corral = median_of(args.runs, lambda: time_command(corral_argv("exec", "bench", "--", "true"),
                                                               env=bench.env))
            alias = str(Path(bench.env["CORRAL_HOME"]) / "ssh_config")
            plain = median_of(args.runs, lambda: time_command(["ssh", "-F", alias, "bench", "true"]))
            python = median_of(args.runs, lambda: time_command([sys.executable, "-c", "pass"]))
        finally:
            subprocess.run(corral_argv("down", "bench"), env=bench.env, capture_output=True)
    print_table(f"exec round trip (median of {args.runs})", [
        ("corral exec NAME -- true (vs ssh srun --jobid --overlap true, mux)", corral, raw, "-"),
        ("ssh NAME true, sshd -i step (vs ssh srun --overlap true, new conn)", plain, raw_new, "-"),
        ("  of which: python -c pass", python, None, "-"),
    ])


if __name__ == "__main__":
    main()
