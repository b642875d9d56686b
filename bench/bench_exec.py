"""`corral exec NAME -- true` round trip vs raw `ssh <login> srun --jobid … --overlap true`, same run.

Run as root with the testbed (`python -m testbed up`):  python bench/bench_exec.py
Both over ControlMasters that are already up; the allocation is a 1-node CPU allocation on alpine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import corral_argv, median_of, print_table, time_command  # noqa: E402
from testbed import Testbed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    bed = Testbed()
    bed.up(install_user_config=False)
    config = str(bed.cluster_config)
    scratch = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    env = {**os.environ, "CORRAL_SLURM_CONFIG": config, "CORRAL_HOME": str(scratch / "home")}
    raw_ssh = ["ssh", "-F", config, "-o", "BatchMode=yes", "-o", "ControlMaster=auto",
               "-o", f"ControlPath={scratch}/raw-%C", "-o", "ControlPersist=120", "alpine"]
    try:
        up = subprocess.run(corral_argv("launch", "-c", "bench", "--infra", "slurm/alpine/cpu", "--json"),
                            env=env, capture_output=True, text=True, check=True)
        job = json.loads(up.stdout)["slurm_job_id"]
        raw = median_of(args.runs, lambda: time_command([*raw_ssh, f"srun --jobid={job} --overlap true"]))
        corral = median_of(args.runs, lambda: time_command(corral_argv("exec", "bench", "--", "true"), env=env))
        python = median_of(args.runs, lambda: time_command([sys.executable, "-c", "pass"]))
    finally:
        subprocess.run(corral_argv("down", "bench"), env=env, capture_output=True)
        for sock in scratch.glob("raw-*"):
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(f"exec round trip (median of {args.runs})", [
        ("corral exec NAME -- true (vs ssh srun --jobid --overlap true, mux)", corral, raw, "-"),
        ("  of which: python -c pass", python, None, "-"),
    ])


if __name__ == "__main__":
    main()
