"""Shared helpers for benchmarks: timing of whole commands, medians, the result table."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def time_command(argv: Sequence[str], env: dict[str, str] | None = None, check: bool = True) -> float:
    started = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    if check and proc.returncode != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(argv)}\n{proc.stderr}")
    return elapsed


def median_of(runs: int, measure: Callable[[], float], warmup: int = 1) -> float:
    for _ in range(warmup):
        measure()
    return statistics.median(measure() for _ in range(runs))


def corral_argv(*args: str) -> list[str]:
    """The installed console script, as a user runs it."""
    exe = os.path.join(os.path.dirname(sys.executable), "corral")
    return [exe if os.path.exists(exe) else "corral", *args]


def wait_managed_ended(env: dict[str, str], ids: list[str]) -> dict[str, str]:
    """Poll `corral jobs queue` (the server `env` names) until every managed job of `ids` has ended; their
    states then, by id."""
    import json

    ended = ("SUCCEEDED", "FAILED", "FAILED_SETUP", "CANCELLED")
    while True:
        shown = json.loads(subprocess.run(corral_argv("jobs", "queue", "-a", "--json"), env=env, check=True,
                                          capture_output=True, text=True).stdout)
        states = {j["job_id"]: j["state"] for j in shown}
        if all(states.get(i) in ended for i in ids):
            return {i: states[i] for i in ids}
        time.sleep(0.1)


def print_table(title: str, rows: list[tuple[str, float, float | None, str]]) -> None:
    """rows: (what, seconds, baseline seconds or None, goal)."""
    print(f"\n{title}")
    width = max([66, *(len(row[0]) for row in rows)])
    print(f"{'measure':{width}} {'seconds':>9} {'baseline':>9} {'ratio':>7}  goal")
    for what, seconds, baseline, goal in rows:
        base = f"{baseline:9.3f}" if baseline is not None else f"{'-':>9}"
        ratio = f"{seconds / baseline:6.2f}x" if baseline else f"{'-':>7}"
        print(f"{what:{width}} {seconds:9.3f} {base} {ratio}  {goal}")


@dataclass
class BenchSetup:
    """The testbed, a scratch dir, Corral's environment, and a raw ssh over a ControlMaster of its own."""

    config: str
    clusters: list[str]
    scratch: Path
    env: dict[str, str]

    def raw_ssh(self, cluster: str, *, mux: bool = True) -> list[str]:
        control = (["-o", "ControlMaster=auto", "-o", f"ControlPath={self.scratch}/raw-%C",
                    "-o", "ControlPersist=300"] if mux else ["-o", "ControlMaster=no", "-o", "ControlPath=none"])
        return ["ssh", "-F", self.config, "-o", "BatchMode=yes", *control, cluster]


STACK = ("fastapi", "pydantic", "sqlalchemy", "uvicorn", "click", "rich")


def stack() -> str:
    """What the figures depend on besides Corral: Python, the libraries' versions, the host's speed (an
    empty loop of 3,000,000 iterations; 0.09-0.10 s on the host of 2026-12-04)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    started = time.perf_counter()
    for _ in range(3_000_000):
        pass
    loop = time.perf_counter() - started
    return (f"python {sys.version.split()[0]}; " + ", ".join(f"{name} {installed(name)}" for name in STACK)
            + f"; empty loop of 3e6: {loop:.2f} s; {os.cpu_count()} cores")


@contextmanager
def bench_testbed(bed: Any = None) -> Iterator[BenchSetup]:
    """Bring the testbed up (the main three clusters, or `bed`, e.g. the scale mode's); afterwards close
    every ControlMaster the benchmark opened."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from testbed import Testbed

    bed = bed or Testbed()
    bed.up(install_user_config=False)
    print(stack())
    scratch = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    env = {**os.environ, "CORRAL_SLURM_CONFIG": str(bed.cluster_config), "CORRAL_HOME": str(scratch / "home")}
    try:
        yield BenchSetup(str(bed.cluster_config), [s.name for s in bed.clusters], scratch, env)
    finally:
        close_masters(scratch)
        shutil.rmtree(scratch, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far, in seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_pid(home: Path) -> int | None:
    """The pid of the Corral server whose CORRAL_HOME is `home` (found through /proc), or None."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"corral.controller" not in (proc / "cmdline").read_bytes():
                continue
            if f"CORRAL_HOME={home}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except OSError:
            continue
    return None


def close_masters(root: Path) -> None:
    """Stop the Corral server of each CORRAL_HOME below root, then `ssh -O exit` every ControlMaster socket."""
    from corral.ssh import stop_masters

    stop_masters(root, "exit")  # the raw ssh baselines' own masters (raw-*)
    for home in root.glob("*home*"):
        # the home's server first: it holds ControlMasters of its own and would keep them open
        subprocess.run([sys.executable, "-m", "corral", "server", "stop"], env={**os.environ, "CORRAL_HOME": str(home)},
                       capture_output=True)
        code = "from corral.ssh import control_dir; print(control_dir())"
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CORRAL_HOME": str(home)},
                             capture_output=True, text=True).stdout.strip()
        if out:
            stop_masters(Path(out), "exit")


def cancel_all(config: str, clusters: list[str]) -> None:
    """Cancel every job of the testbed's user on every cluster."""
    import subprocess

    for cluster in clusters:
        subprocess.run(["ssh", "-F", config, cluster, "scancel -u corral-test"], capture_output=True)
