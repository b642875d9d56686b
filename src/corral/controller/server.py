"""`corral server`: the controller loop as a background process on this machine, one per state store.

Commands that need it (`corral jobs launch`) start it on demand; `corral server stop` ends it. It
needs no port yet: the CLI and the controller meet in the state store (the HTTP API for team mode
comes with the shared server). Its pid and log live under CORRAL_HOME.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from corral.config import corral_home

MAX_INTERVAL = 10.0


def pid_file() -> Path:
    return corral_home() / "controller.pid"


def log_file() -> Path:
    return corral_home() / "controller.log"


def running_pid() -> int | None:
    try:
        pid = int(pid_file().read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"corral.controller" not in f.read():
                return None
    except OSError:
        return None
    return pid


def start() -> int:
    """Start the controller in the background unless it runs (then wake it); returns its pid."""
    pid = running_pid()
    if pid:
        os.kill(pid, signal.SIGUSR1)
        return pid
    home = corral_home()
    home.mkdir(parents=True, exist_ok=True)
    with open(log_file(), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "corral.controller", "run"], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True, env=os.environ.copy())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if running_pid() == proc.pid:
            return proc.pid
        if proc.poll() is not None:
            raise RuntimeError(f"the controller exited at once; see {log_file()}")
        time.sleep(0.05)
    raise RuntimeError(f"the controller did not start within 10 s; see {log_file()}")


def stop(timeout: float = 20) -> bool:
    pid = running_pid()
    if not pid:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and running_pid() == pid:
        time.sleep(0.1)
    if running_pid() == pid:
        os.kill(pid, signal.SIGKILL)
    return True


def run() -> None:
    """The loop: tick, then wait; faster while jobs are on the move, slower when idle or on errors."""
    from corral.client import Client
    from corral.controller.engine import LEASE, Controller, ControllerSettings
    from corral.state import open_store

    store = open_store()
    holder = f"{socket.gethostname()}:{os.getpid()}"
    controller = Controller(Client(), store, holder, ControllerSettings.from_env())
    stopping = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    woken = False

    def on_wake(_sig: int, _frame: object) -> None:
        nonlocal woken
        woken = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGUSR1, on_wake)  # new work: tick now
    pid_file().write_text(f"{os.getpid()}\n")  # only now: a wake-up signal before the handler would kill us
    base = float(os.environ.get("CORRAL_CONTROLLER_INTERVAL", "5"))
    interval = base
    print(f"corral controller {holder} started (interval {base:g}s)", flush=True)
    try:
        while not stopping:
            started = time.monotonic()
            try:
                report = asyncio.run(controller.tick())
                if report.errors:  # back off while clusters fail
                    interval = min(MAX_INTERVAL, interval * 1.5)
                elif report.jobs:  # live managed jobs: the configured pace
                    interval = base
                else:  # nothing to drive: slow down
                    interval = min(MAX_INTERVAL, max(base, interval * 1.5))
                if report.drove and (report.submitted or report.moved or report.cancelled or report.errors):
                    print(f"tick: jobs={report.jobs} submitted={report.submitted} moved={report.moved} "
                          f"cancelled={report.cancelled} trips={report.round_trips} errors={report.errors}",
                          flush=True)
            except Exception as exc:  # one bad tick must not stop recovery of every job
                print(f"tick failed: {exc!r}", flush=True)
                interval = min(MAX_INTERVAL, interval * 2)
            remaining = interval - (time.monotonic() - started)
            end = time.monotonic() + max(0.0, remaining)
            while not stopping and not woken and time.monotonic() < end:
                time.sleep(0.1)
            if woken:
                woken = False
                interval = base
    finally:
        store.release_lease(LEASE, holder)
        if running_pid() == os.getpid():
            pid_file().unlink(missing_ok=True)
