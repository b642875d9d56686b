"""`corral gpus` over every cluster vs the slowest single `ssh <cluster> sinfo`, and CLI cold start.

Run as root on a machine with the testbed (`python -m testbed up`):  python bench/bench_gpus.py
Both sides are measured in the same run, against the same login nodes:
- cold: no ControlMaster anywhere (a fresh CORRAL_HOME for Corral, ControlMaster=no for ssh);
- warm: Corral's masters already up vs plain ssh over a ControlMaster of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import corral_argv, median_of, print_table, time_command  # noqa: E402
from testbed import Testbed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    bed = Testbed()
    bed.up(install_user_config=False)
    config = str(bed.cluster_config)
    clusters = [s.name for s in bed.clusters]
    scratch = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    env = {**os.environ, "CORRAL_SLURM_CONFIG": config}

    def ssh_sinfo(cluster: str, control: list[str]) -> float:
        return time_command(["ssh", "-F", config, "-o", "BatchMode=yes", *control, cluster, "sinfo"])

    cold_ssh = ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    warm_ssh = ["-o", "ControlMaster=auto", "-o", f"ControlPath={scratch}/raw-%C", "-o", "ControlPersist=120"]

    def slowest_sinfo(control: list[str]) -> float:
        return max(ssh_sinfo(c, control) for c in clusters)

    def parallel_sinfo(control: list[str]) -> float:
        """What a shell script would do: `ssh <c> sinfo &` for every cluster, then wait."""
        started = time.perf_counter()
        procs = [subprocess.Popen(["ssh", "-F", config, "-o", "BatchMode=yes", *control, c, "sinfo"],
                                  stdout=subprocess.DEVNULL) for c in clusters]
        if any(p.wait() for p in procs):
            raise SystemExit("ssh sinfo failed")
        return time.perf_counter() - started

    counter = iter(range(10**6))

    def corral_gpus_cold() -> float:
        home = scratch / f"cold-{next(counter)}"
        seconds = time_command(corral_argv("gpus", "--json"), env={**env, "CORRAL_HOME": str(home)})
        _close_masters(home)
        return seconds

    warm_home = scratch / "warm"

    def corral_gpus_warm() -> float:
        return time_command(corral_argv("gpus", "--json"), env={**env, "CORRAL_HOME": str(warm_home)})

    def help_cold() -> float:
        return time_command(corral_argv("--help"), env=env)

    baseline_cold = median_of(args.runs, lambda: slowest_sinfo(cold_ssh))
    gpus_cold = median_of(args.runs, corral_gpus_cold)
    parallel_cold = median_of(args.runs, lambda: parallel_sinfo(cold_ssh))
    baseline_warm = median_of(args.runs, lambda: slowest_sinfo(warm_ssh))
    gpus_warm = median_of(args.runs, corral_gpus_warm)
    python_start = median_of(args.runs, lambda: time_command([sys.executable, "-c", "pass"]))
    help_time = median_of(args.runs, help_cold)
    print_table(
        f"corral gpus over {len(clusters)} clusters (median of {args.runs} runs)",
        [
            ("corral gpus, no ControlMaster (vs slowest ssh sinfo, new conn)", gpus_cold, baseline_cold,
             "<= 1.3x"),
            ("corral gpus, no ControlMaster (vs ssh sinfo to all, parallel)", gpus_cold, parallel_cold, "-"),
            ("corral gpus, ControlMasters up (vs slowest ssh sinfo, new conn)", gpus_warm, baseline_cold,
             "<= 1.3x"),
            ("corral gpus, ControlMasters up (vs slowest ssh sinfo, mux)", gpus_warm, baseline_warm, "-"),
            ("corral --help cold start (baseline: python -c pass)", help_time, python_start, "<= 0.3 s"),
        ],
    )
    _close_masters(warm_home)
    for sock in scratch.glob("raw-*"):
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)
    shutil.rmtree(scratch, ignore_errors=True)


def _close_masters(home: Path) -> None:
    env = {**os.environ, "CORRAL_HOME": str(home)}
    code = "from corral.ssh import control_dir; print(control_dir())"
    sockets = Path(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip())
    for sock in sockets.glob("*"):
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)
    shutil.rmtree(sockets, ignore_errors=True)


if __name__ == "__main__":
    main()
