"""Helpers for integration tests that talk to the testbed as a user would."""

from __future__ import annotations

import subprocess
from pathlib import Path


def ssh_login(config: Path, cluster: str, command: str, timeout: float = 30) -> str:
    """Run a command on a testbed login node with plain ssh (the baseline, not Corral)."""
    proc = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", cluster, command],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"ssh {cluster} {command!r} failed: {proc.stderr}")
    return proc.stdout


def job_state(config: Path, cluster: str, job_id: str) -> str:
    return ssh_login(config, cluster, f"squeue -h -t all -j {job_id} -o %T").strip()


def host_block(config_text: str, host: str) -> str:
    """The `Host <host>` block of a cluster file, up to the next Host line."""
    lines = config_text.splitlines()
    start = lines.index(f"Host {host}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("Host ")), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def option(block: str, key: str) -> str:
    for line in block.splitlines():
        parts = line.split(None, 1)
        if parts and parts[0] == key:
            return parts[1]
    raise KeyError(key)
