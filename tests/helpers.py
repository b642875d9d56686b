"""Helpers for integration tests that talk to the testbed as a user would."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from collections.abc import Callable, Iterator
from pathlib import Path


class ManualClock:
    """A clock a test moves by hand: `clock.now += 30`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def logged_in(browser, corral, env=None):
    """A browser context on the dashboard, logged in through `corral dashboard --print-url` (as the CLI's
    user, or as the server of `env`)."""
    printed = corral("dashboard", "--print-url", **({"env": env} if env else {}))
    assert printed.exit_code == 0, printed.stderr
    link = printed.stdout.strip()
    context = browser.new_context()
    page = context.new_page()
    page.goto(link)
    return context, page, link


def free_port() -> int:
    """A loopback TCP port free right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runs_somewhere(*argv: str) -> bool:
    """Whether some process on this machine (the testbed's nodes included) runs exactly `argv`."""
    wanted = b"\0".join(a.encode() for a in argv) + b"\0"
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes() == wanted:
                return True
        except OSError:  # it ended while we looked
            pass
    return False


def ssh_login(config: Path, cluster: str, command: str, timeout: float = 30) -> str:
    """Run a command on a testbed login node with plain ssh (the baseline, not Corral)."""
    proc = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", cluster, command],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"ssh {cluster} {command!r} failed: {proc.stderr}")
    return proc.stdout


def as_member(testbed, user: str, cluster: str, command: str, stdin: str | None = None
              ) -> subprocess.CompletedProcess:
    """`ssh` to a login node as a team member, with their own key (not the test user's)."""
    return subprocess.run(["ssh", "-F", str(testbed.cluster_config), "-l", user, "-i",
                           str(testbed.paths.user_key(user)), "-o", "BatchMode=yes", cluster, command],
                          capture_output=True, text=True, timeout=60, input=stdin)


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


# Every H100 of alpine taken for 1 h and every H100 of borealis for 10 h, by jobs submitted outside
# Corral: nothing can start an H100 job now, and alpine is predicted to start one first.
H100_BLOCKERS = {
    "alpine": "sbatch -o /dev/null --parsable -p gpu -N2 -t 60 --gres=gpu:nvidia_h100_80gb_hbm3:4 --wrap 'sleep 900'",
    "borealis": "sbatch -o /dev/null --parsable -p h100-cluster -N2 -t 600 --gres=gpu:H100:8 --wrap 'sleep 900'",
}


def fill_h100s(config: Path) -> dict[str, str]:
    """Submit the H100 blockers and wait until they run; returns their Slurm ids by cluster."""
    from tests.conftest import wait_for

    blockers = {cluster: ssh_login(config, cluster, command).strip() for cluster, command in H100_BLOCKERS.items()}
    for cluster, job in blockers.items():
        wait_for(f"{cluster} to be full", lambda c=cluster, j=job: job_state(config, c, j) == "RUNNING")
    return blockers


def counting_ssh(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, str], Callable[[], list[str]]]:
    """An environment whose `ssh` is a PATH shim that logs each call, and a function giving the
    cluster of every call made so far, in order: SSH round trips counted, not timed. The masters a
    starting server opens ahead (`ssh -G` to read the settings, then `ssh -N -f`: a connection, no remote
    command) are not round trips, nor are the requests to masters (`ssh -O stop`, as a server that stops
    makes)."""
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir(exist_ok=True)
    log = tmp_path / "ssh-calls"
    (shim_dir / "ssh").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec /usr/bin/ssh "$@"\n')
    (shim_dir / "ssh").chmod(0o755)

    def calls() -> list[str]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [line.split(" -- ")[1].split()[0] for line in lines
                if " -- " in line and not {"-N", "-G", "-O"} & set(line.split(" -- ")[0].split())]

    return {**env, "PATH": f"{shim_dir}{os.pathsep}{env.get('PATH', os.environ['PATH'])}"}, calls


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """The real CLI in this process: (exit code, stdout, stderr); the umask is restored afterwards."""
    out, err = io.TextIOWrapper(io.BytesIO(), write_through=True), io.StringIO()
    saved = sys.argv
    sys.argv = ["corral", *argv]
    umask = os.umask(0o022)  # main() sets its process's umask; this process is not one it owns
    os.umask(umask)
    code = 0
    try:
        from corral.cli.main import main

        with redirect_stdout(out), redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
        os.umask(umask)
    out.seek(0)
    return code, out.read(), err.getvalue()


# Every node of every partition of the three clusters taken, by jobs submitted outside Corral.
NODE_BLOCKERS = {"alpine": [("gpu", 2), ("cpu", 1), ("inference", 1)], "borealis": [("h100-cluster", 2), ("l40s", 1)],
                 "cirrus": [("b300", 2), ("debug", 1)]}


def fill_every_node(config: Path) -> dict[str, list[str]]:
    """Submit a blocker per partition and wait until they run: no Slurm cluster can start anything now.
    Returns their Slurm ids by cluster (scancel them afterwards)."""
    from tests.conftest import wait_for

    blockers = {cluster: [ssh_login(config, cluster, f"sbatch -o /dev/null --parsable -p {partition} -N{nodes} --exclusive -t 50 "
                                                      "--wrap 'sleep 1800'").strip() for partition, nodes in parts]
                for cluster, parts in NODE_BLOCKERS.items()}
    for cluster, jobs in blockers.items():
        for job in jobs:
            wait_for(f"{cluster} to be full", lambda c=cluster, j=job: job_state(config, c, j) == "RUNNING")
    return blockers


def launch_managed(corral, env: dict[str, str], task: Path, spec: dict) -> tuple[str, Callable[[], dict]]:
    """Write `spec` as the task file `task` and launch it as a managed job: its id, and a function
    giving its row of `corral jobs queue -a` now."""
    import json

    task.write_text(json.dumps(spec))
    launched = corral("jobs", "launch", "--json", str(task), env=env)
    assert launched.exit_code == 0, launched.stderr
    job_id = launched.json()["job_id"]

    def managed() -> dict:
        return {j["job_id"]: j for j in corral("jobs", "queue", "-a", "--json", env=env).json()}[job_id]

    return job_id, managed


def cancel_a_running_exec(corral, env: dict[str, str], name: str) -> str:
    """Run `echo started; sleep 300` in allocation `name`, follow it with `corral logs` from a second
    client, then `corral cancel -a -y`: both clients end, and the exec (only it) is cancelled. Its job id."""
    argv = [sys.executable, "-m", "corral"]
    runner = subprocess.Popen([*argv, "exec", name, "--", "echo started; sleep 300"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    follower = None
    try:
        assert runner.stdout is not None and runner.stdout.readline() == "started\n"
        [job] = corral("queue", name, "-s", "--json", env=env).json()  # the live one
        assert job["state"] == "RUNNING"
        follower = subprocess.Popen([*argv, "logs", job["job_id"]], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        assert follower.stdout is not None and follower.stdout.readline() == "started\n"
        cancel = corral("cancel", "-a", "-y", env=env)
        assert cancel.exit_code == 0 and cancel.stdout.strip() == f"{job['job_id']}: cancelled", cancel.stderr
        _, stopped = runner.communicate(timeout=60)
        assert runner.returncode in (137, 143), stopped  # ended as KILL (srun's step) or TERM
        assert stopped.endswith(f"corral: {job['job_id']} was cancelled (cancelled by user); allocation {name!r} "
                                "is still held\n"), stopped
        _, followed = follower.communicate(timeout=60)  # it ends with the exec, not with the allocation
        assert follower.returncode != 0 and f"corral: {job['job_id']} CANCELLED" in followed, followed
    finally:
        for proc in (runner, follower):
            if proc is not None:
                proc.kill()
    [ended] = [j for j in corral("queue", name, "--json", env=env).json() if j["job_id"] == job["job_id"]]
    assert (ended["state"], ended["reason"]) == ("CANCELLED", "cancelled by user")
    return job["job_id"]


def dead_tag() -> str:
    """The submitter tag of a process that has ended, leaving nothing behind."""
    return subprocess.run([sys.executable, "-c", "from corral.liveness import process_tag; print(process_tag())"],
                          capture_output=True, text=True, check=True).stdout.strip()


@contextmanager
def dead_leader_with_child() -> Iterator[tuple[str, Callable[[], None]]]:
    """The tag of a session leader (as the server is) that started a child and was gone; and a function
    that ends the child (as a killed server's `ssh … sbatch` ends once sent), returning once it has."""
    from tests.conftest import wait_for

    leader = subprocess.Popen([sys.executable, "-c", "import subprocess\n"
                               "from corral.liveness import process_tag\n"
                               "child = subprocess.Popen(['sleep', '600'], stdout=subprocess.DEVNULL)\n"
                               "print(process_tag(), child.pid, flush=True)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    tag, pid = leader.stdout.readline().split()
    leader.wait()
    leader.stdout.close()

    def end_child() -> None:
        os.kill(int(pid), signal.SIGKILL)
        wait_for("the child to end", lambda: not os.path.exists(f"/proc/{pid}")  # or a zombie, reaped by init
                 or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", timeout=10, interval=0.05)

    try:
        yield tag, end_child
    finally:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
