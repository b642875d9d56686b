"""Small process helpers: pid files, liveness, waiting, killing a process tree."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class TestbedError(RuntimeError):
    pass


def read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def started_at(pid: int) -> float | None:
    """When the process started, in seconds since the epoch (to within a second: the kernel's boot
    time is whole seconds); None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    with open("/proc/stat") as f:
        return float(next(line.split()[1] for line in f if line.startswith("btime ")))


PID_REUSE_SLACK = 2.0  # seconds: the boot time's rounding and a pid file's write after its process began


def running(pidfile: Path) -> int | None:
    """The pid the file names if that process is alive and is the one the file was written for.

    A pid file outlives its process, and pids are reused (32,768 of them go round in one CI run), so
    a live process that began after the file was last written is another one: it is not reported,
    and so never waited for as the daemon nor killed in its place. Unless it runs the program the file
    is named for (`slurmd-b2.pid`: slurmd for node b2): a process's start time is counted from the
    boot time, which moves when the wall clock is stepped (a paused VM catching up: 10 s once in CI,
    after which every daemon seemed to have begun after its pid file)."""
    pid = read_pid(pidfile)
    if pid is None or not alive(pid):
        return None
    began = started_at(pid)
    try:
        written = pidfile.stat().st_mtime
    except OSError:
        return None
    if began is not None and began <= written + PID_REUSE_SLACK:
        return pid
    return pid if runs_program_of(pid, pidfile) else None


_PROGRAMS = {"mysqld": "mariadbd"}  # a pid file's name -> its daemon's program, where they differ


def runs_program_of(pid: int, pidfile: Path) -> bool:
    """Does the process run the daemon its pid file is named for (`slurmd-<node>.pid`: that node's)?"""
    try:
        program = Path(f"/proc/{pid}/comm").read_text().strip()
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    name = pidfile.name.removesuffix(".pid")
    if name.startswith("slurmd-"):
        return program == "slurmd" and name.removeprefix("slurmd-").encode() in arguments
    return program == _PROGRAMS.get(name, name)


def wait_until(what: str, predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TestbedError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Signal a process and all its descendants, then wait until they are gone."""
    victims = [pid, *descendants(pid)]
    for victim in victims:
        try:
            os.kill(victim, sig)
        except ProcessLookupError:
            pass
    try:
        wait_until(f"pid {pid} to exit", lambda: not any(alive(v) for v in victims), timeout)
    except TestbedError:
        for victim in victims:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_until(f"pid {pid} to die", lambda: not any(alive(v) for v in victims), 5)


def signal_tree(pid: int, sig: int) -> None:
    """Send a signal to a process and all its descendants, without waiting (SIGSTOP, SIGCONT)."""
    for victim in [pid, *descendants(pid)]:
        try:
            os.kill(victim, sig)
        except ProcessLookupError:
            pass


def run(cmd: list[str], env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a daemon detached from us; it outlives this process."""
    with open(log, "ab") as out:
        # cwd "/": a daemon must not keep (and hand its job steps) a directory that may be deleted.
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True, cwd="/"
        )


def spawn_as_host(hostname: str, cmd: list[str], log: Path, pidfile: Path,
                  env: dict[str, str] | None = None, own_ptys: bool = False) -> subprocess.Popen[bytes]:
    """Start a daemon in its own UTS namespace, so `hostname` there prints `hostname`.

    With `own_ptys`, it also gets its own /dev/pts mounted as a distribution mounts it (group tty,
    mode 620). Container runtimes often mount it without `gid=5`, and then an sshd run as a user on
    a "compute node" cannot hand out terminals (it must chown them to group tty); real nodes can.

    The pid is written by us as well as by the daemon, so that a daemon that dies before writing its
    own pid file is still found (and its log pointed at) by the readiness checks.
    """
    script = 'hostname "$1" && shift && exec "$@"'
    namespaces = ["--uts"]
    if own_ptys:
        namespaces.append("--mount")
        script = ("mount -t devpts -o newinstance,gid=5,mode=620,ptmxmode=666 devpts /dev/pts && "
                  "mount --bind /dev/pts/ptmx /dev/ptmx && " + script)
    proc = spawn(["unshare", *namespaces, "sh", "-c", script, "sh", hostname, *cmd], log, env=env)
    pidfile.write_text(f"{proc.pid}\n")
    return proc
