"""`corral server`: the one engine process on this machine, one per state store: the controller loop
and the `/v1` API (`controller/api.py`) on one event loop, holding the store and the ControlMasters.

The CLI and the SDK start it on demand (`sdk/endpoint.py`); SIGUSR1 wakes its loop; `corral server
stop` ends it. It serves on loopback on an ephemeral port; the port and a bearer token are in
`controller.json` (mode 600), its pid and log beside it, under CORRAL_HOME. Jobs live in the store, so
nothing is lost while it is down.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from corral.config import corral_home, private_file, write_private
from corral.errors import CorralError, UnavailableError

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


def endpoint_file() -> Path:
    return corral_home() / "controller.json"


def read_endpoint() -> dict[str, Any] | None:
    """The running server's port, token and settings (None if it does not run)."""
    try:
        endpoint = json.loads(endpoint_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(endpoint, dict) or running_pid() != endpoint.get("pid"):
        return None
    return endpoint


class ControllerUnavailable(UnavailableError):
    pass


def lock_file() -> Path:
    """Held (flock) by the running controller for its whole life: one controller per Corral home."""
    return corral_home() / "controller.lock"


def start() -> int:
    """Start the controller in the background unless it runs (then wake it); returns its pid.
    Commands that call this at the same moment take turns: the first starts it, the rest wake it."""
    from corral.locks import held

    with held(corral_home() / "controller.start.lock"):
        pid = running_pid()
        if pid:
            os.kill(pid, signal.SIGUSR1)  # the loop ticks at once on it (new work)
            return pid
        with open(private_file(log_file()), "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "corral.controller", "run"], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log, start_new_session=True, env=os.environ.copy())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if running_pid() == proc.pid:
                return proc.pid
            if proc.poll() is not None:
                raise ControllerUnavailable(f"the controller exited at once; see {log_file()}")
            time.sleep(0.05)
        raise ControllerUnavailable(f"the controller did not start within 10 s; see {log_file()}")


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
    import asyncio
    import fcntl

    with open(private_file(lock_file()), "w") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(f"another controller already runs for {corral_home()} (pid {running_pid()})")
        asyncio.run(_run())  # the lock goes with the process, however it ends


async def _run() -> None:
    """The loop: tick, then wait; faster while jobs are on the move, slower when idle or on errors.
    The API serves on the same event loop, between and during ticks' remote calls."""
    import asyncio
    import secrets

    import uvicorn

    from corral.client import Client
    from corral.controller.api import ControllerStatus, TickFigures, create_app
    from corral.controller.engine import LEASE, Controller, ControllerSettings
    from corral.sdk.endpoint import settings as endpoint_settings
    from corral.state import open_store

    store = open_store()
    holder = f"{socket.gethostname()}:{os.getpid()}"
    controller = Controller(Client(), store, holder, ControllerSettings.from_env())
    base = float(os.environ.get("CORRAL_CONTROLLER_INTERVAL", "5"))
    status = ControllerStatus(pid=os.getpid(), holder=holder, started_at=time.time(), interval=base,
                              wake=asyncio.Event())
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    loop.add_signal_handler(signal.SIGUSR1, status.wake.set)  # new work: tick now

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    token = secrets.token_urlsafe(32)
    config = uvicorn.Config(create_app(status, store, token, controller.refreshes), log_level="warning", access_log=False,
                            lifespan="off")
    api = _api_server(config)
    serving = asyncio.create_task(api.serve(sockets=[listener]))
    while not api.started:  # `start` returns once the pid file is there: by then the API answers
        if serving.done():
            serving.result()  # raises why it could not serve
            raise RuntimeError("the API server stopped during start-up")
        await asyncio.sleep(0.01)
    endpoint = endpoint_file()
    endpoint.unlink(missing_ok=True)
    fd = os.open(endpoint, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "port": listener.getsockname()[1], "token": token,
                   "settings": endpoint_settings()}, f)
    write_private(pid_file(), f"{os.getpid()}\n")  # last: `start` waits for it, so the API is up by then
    print(f"corral controller {holder} started (interval {base:g}s, API on 127.0.0.1:{listener.getsockname()[1]})",
          flush=True)
    interval = base
    longest = max(MAX_INTERVAL, base)
    pruned_at = -math.inf
    try:
        while not stopping.is_set():
            started = time.monotonic()
            if started - pruned_at > PRUNE_INTERVAL:
                pruned_at = started
                _prune_uploads(store)
            try:
                report = await controller.tick()
                status.ticks += 1
                status.last_tick = TickFigures(at=time.time(), seconds=round(time.monotonic() - started, 4),
                                               drove=report.drove, jobs=report.jobs, submitted=report.submitted,
                                               moved=report.moved, cancelled=report.cancelled,
                                               round_trips=report.round_trips, errors=report.errors)
                if report.errors:  # back off while clusters fail
                    interval = min(longest, interval * 1.5)
                elif report.jobs:  # live managed jobs: the configured pace
                    interval = base
                else:  # nothing to drive: slow down
                    interval = min(longest, max(base, interval * 1.5))
                if report.drove and (report.submitted or report.moved or report.cancelled or report.errors):
                    print(f"tick: jobs={report.jobs} submitted={report.submitted} moved={report.moved} "
                          f"cancelled={report.cancelled} trips={report.round_trips} errors={report.errors}",
                          flush=True)
            except Exception as exc:  # one bad tick must not stop recovery of every job
                print(f"tick failed: {exc!r}", flush=True)
                interval = min(longest, interval * 2)
            _return_free_memory()
            status.interval = interval
            remaining = max(0.0, interval - (time.monotonic() - started))
            woken = asyncio.ensure_future(status.wake.wait())
            stop = asyncio.ensure_future(stopping.wait())
            await asyncio.wait([woken, stop], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            stop.cancel()
            if status.wake.is_set():
                status.wake.clear()
                interval = base
    finally:
        api.should_exit = True
        await serving
        store.release_lease(LEASE, holder)
        if running_pid() == os.getpid():
            pid_file().unlink(missing_ok=True)
            endpoint.unlink(missing_ok=True)


PRUNE_INTERVAL = 3600.0  # seconds between removals of old uploads


def _prune_uploads(store: Any) -> None:
    from corral import uploads

    try:
        removed = uploads.prune(store.live_managed_tasks())
    except (OSError, CorralError) as exc:  # never a reason to stop driving jobs
        print(f"pruning uploads failed: {exc!r}", flush=True)
        return
    if removed:
        print(f"removed {len(removed)} old upload(s)", flush=True)


def _return_free_memory() -> None:
    """Give the heap a tick freed back to the system. A tick over 10,000 managed jobs builds ~60 MB of
    rows and statuses and drops them; glibc keeps such memory mapped, so the server's resident size
    would stay at its largest tick's. One call, ~1 ms; a no-op where there is no glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _api_server(config: Any) -> Any:
    """uvicorn's server without its signal handling: SIGTERM must end the tick loop (which then
    releases the lease), not just the API."""
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server(config)
