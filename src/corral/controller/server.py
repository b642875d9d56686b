"""`corral server`: the one engine process on this machine, one per state store: the controller loop
and the `/v1` API (`controller/api.py`) on one event loop, holding the store and the ControlMasters.

The CLI and the SDK start it on demand (`sdk/endpoint.py`); SIGUSR1 wakes its loop; `corral server
stop` ends it. It serves on loopback on an ephemeral port; the port and a bearer token are in
`controller.json` (mode 600), its pid and log beside it, under CORRAL_HOME. Jobs live in the store, so
nothing is lost while it is down.

A team server is the same process started with `ServerOptions` (`corral server start --host H --port P
--db URL`, HTTPS with --tls-cert/--tls-key): it serves every registered user (auth.py) and logs each
request. Its options reach the background process as CORRAL_SERVER_* variables.
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.config import corral_home, default_timeout, env_number, private_file, write_private
from corral.controller.running import (  # noqa: F401 - the server's files, re-exported for its callers
    ControllerUnavailable,
    endpoint_file,
    log_file,
    pid_file,
    read_endpoint,
    running_pid,
)
from corral.errors import ConfigError, CorralError

MAX_INTERVAL = 10.0



def _crashed_holder() -> str | None:
    """The lease holder name of this home's previous server, if it left its pid file behind and no
    longer runs (killed, or its machine rebooted). Only one server runs per home (the start lock), so
    it is known dead, and its leases can go at once instead of after the lease period."""
    try:
        pid = int(pid_file().read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid == os.getpid() or running_pid() == pid:
        return None
    return f"{socket.gethostname()}:{pid}"



@dataclass(frozen=True)
class ServerOptions:
    """How a team server serves (all None: this user's local server, on loopback)."""

    host: str | None = None
    port: int | None = None
    db_url: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    sso_header: str | None = None
    trusted_proxies: tuple[str, ...] = ()

    @property
    def team(self) -> bool:
        return bool(self.host or self.port)

    def check(self) -> None:
        import ipaddress

        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("give both --tls-cert and --tls-key, or neither")
        if (self.db_url or self.tls_cert or self.sso_header) and not self.team:
            raise ConfigError("--db, --tls-cert and --sso-header are for a team server: give --host and --port too")
        for net in self.trusted_proxies:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ConfigError(f"--trusted-proxy {net!r}: not an address or network (such as 10.0.0.5 or "
                                  "10.0.0.0/24)") from None
        if self.db_url and not self.db_url.startswith(("postgresql://", "postgresql+psycopg://", "sqlite:///")):
            raise ConfigError(f"--db {self.db_url.split('://')[0]}://…: give a PostgreSQL URL such as "
                              "postgresql+psycopg://corral@db.example.org/corral (or sqlite:///PATH)")

    def to_env(self) -> dict[str, str]:
        values = {"HOST": self.host, "PORT": str(self.port) if self.port else None, "TLS_CERT": self.tls_cert,
                  "TLS_KEY": self.tls_key, "SSO_HEADER": self.sso_header,
                  "TRUSTED_PROXIES": ",".join(self.trusted_proxies) or None}
        env = {f"CORRAL_SERVER_{k}": v for k, v in values.items() if v}
        if self.db_url:
            env["CORRAL_DB_URL"] = self.db_url
        return env

    @classmethod
    def from_env(cls) -> ServerOptions:
        get = os.environ.get
        port = get("CORRAL_SERVER_PORT") or ""
        if port and not (port.isascii() and port.isdigit() and int(port) <= 65535):
            raise ConfigError(f"CORRAL_SERVER_PORT={port!r} is not a port (0 to 65535)")
        proxies = tuple(p for p in get("CORRAL_SERVER_TRUSTED_PROXIES", "").split(",") if p)
        return cls(host=get("CORRAL_SERVER_HOST") or None, port=int(port) if port else None,
                   db_url=get("CORRAL_DB_URL") or None, tls_cert=get("CORRAL_SERVER_TLS_CERT") or None,
                   tls_key=get("CORRAL_SERVER_TLS_KEY") or None, sso_header=get("CORRAL_SERVER_SSO_HEADER") or None,
                   trusted_proxies=proxies)


def _without_server_options(env: Mapping[str, str]) -> dict[str, str]:
    """`env` less the CORRAL_SERVER_* variables: a server's options are those its starter gives it."""
    return {k: v for k, v in env.items() if not k.startswith("CORRAL_SERVER_")}


def lock_file() -> Path:
    """Held (flock) by the running controller for its whole life: one controller per Corral home."""
    return corral_home() / "controller.lock"


def start(options: ServerOptions | None = None) -> int:
    """Start the controller in the background unless it runs (then wake it); returns its pid.
    Commands that call this at the same moment take turns: the first starts it, the rest wake it."""
    from corral.locks import held

    options = options or ServerOptions()
    if options.team:
        from corral.accounts import team_settings

        team_settings()  # a broken `submit_as` fails here, in the command, not in the background
    with held(corral_home() / "controller.start.lock"):
        pid = running_pid()
        if pid:
            running = read_endpoint() or {}
            if options.team and running.get("options") != options.to_env():
                raise ControllerUnavailable(f"a server already runs for {corral_home()} (pid {pid}) with other "
                                            "options; `corral server stop` it first")
            os.kill(pid, signal.SIGUSR1)  # the loop ticks at once on it (new work)
            return pid
        ready, told = os.pipe()  # the server writes one byte on `told` once its API answers (tell_ready)
        try:
            with open(private_file(log_file()), "ab") as log:
                logged = log.tell()
                proc = subprocess.Popen([sys.executable, "-m", "corral.controller", "run"], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=log, start_new_session=True, pass_fds=(told,),
                                        env={**_without_server_options(os.environ), **options.to_env(),
                                             READY_FD: str(told)})
            os.close(told)
            told = -1
            if _await_ready(ready, START_SECONDS):
                return proc.pid
        finally:
            os.close(ready)
            if told >= 0:
                os.close(told)
        try:
            code = proc.wait(timeout=1)  # it closed its end without a word: it is exiting
        except subprocess.TimeoutExpired:
            raise ControllerUnavailable(f"the controller did not start within {START_SECONDS:g} s; "
                                        f"see {log_file()}") from None
        raise _start_failure(logged, code)


READY_FD = "CORRAL_SERVER_READY_FD"  # the pipe a starting server tells its starter on (start, tell_ready)
START_SECONDS = 10.0


def _await_ready(ready: int, seconds: float) -> bool:
    """Whether the server said it is ready within `seconds`: it writes a byte; its end closes without
    one when it exits (or hands the pipe to no one, see tell_ready), so this never polls."""
    import select

    readable, _, _ = select.select([ready], [], [], seconds)
    return bool(readable) and os.read(ready, 1) == b"1"


def _keep_ready_fd() -> int | None:
    """The inherited end of `start`'s pipe, made non-inheritable so that no process the server starts
    (ssh masters that outlive a failed start) can hold it open; None when no command waits."""
    import stat

    raw = os.environ.pop(READY_FD, "")
    if not raw.isdigit():
        return None
    try:
        if not stat.S_ISFIFO(os.fstat(int(raw)).st_mode):
            return None  # not start's pipe (a stray variable): never write to it
        os.set_inheritable(int(raw), False)
    except OSError:
        return None
    return int(raw)


def tell_ready(fd: int | None) -> None:
    """Tell the waiting `start` that the API answers (after the pid file is written)."""
    if fd is None:
        return
    try:
        os.write(fd, b"1")
    except OSError:
        pass  # the command that started it has gone (Ctrl-C): nothing to tell
    finally:
        os.close(fd)


STARTUP_ERROR = "corral: error: "  # how the background server says why it could not start (its last words)


def _start_failure(logged: int, code: int) -> CorralError:
    """Why the server just exited: its own `corral: error:` line in the log (a broken config.yaml, a
    port in use), with its exit status; else where to look."""
    with open(log_file(), "rb") as log:
        log.seek(logged)
        said = [line for line in log.read(65536).decode(errors="replace").splitlines() if line.startswith(STARTUP_ERROR)]
    if not said:
        return ControllerUnavailable(f"the controller exited at once; see {log_file()}")
    error = CorralError(said[-1].removeprefix(STARTUP_ERROR))
    error.exit_code = code or ControllerUnavailable.exit_code
    return error


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


def run(options: ServerOptions | None = None) -> None:
    """Serve in this process until SIGTERM (`corral server start --foreground`, or the background child)."""
    import asyncio
    import fcntl

    ready_fd = _keep_ready_fd()
    options = options or ServerOptions.from_env()  # checked by the command that started it
    os.environ.update(options.to_env())  # the store and what `start` compares read them from here
    with open(private_file(lock_file()), "w") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(f"another controller already runs for {corral_home()} (pid {running_pid()})")
        _open_masters()
        try:
            asyncio.run(_run(options, ready_fd))  # the lock goes with the process, however it ends
        finally:
            from corral.ssh import control_dir, stop_masters

            stop_masters(control_dir())  # else they would hold their connections for ControlPersist


def _open_masters() -> None:
    """The SSH handshakes to every Slurm cluster, started before the engine's modules load (~1 s), so
    that they run meanwhile (ssh.open_masters)."""
    from corral.config import load_registry
    from corral.ssh import open_masters

    try:
        registry = load_registry()
    except CorralError:
        return  # a broken cluster file: the first command says what is wrong with it
    open_masters(registry, registry.names_of("slurm"))


def _listener(options: ServerOptions) -> socket.socket:
    """The server's socket: loopback and any free port, or the team server's address."""
    host = options.host or "127.0.0.1"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, options.port or 0, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host!r}: {exc.strerror}") from None
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot serve on {host}:{options.port or 0}: {exc.strerror}") from None
    return listener


def _local_url(options: ServerOptions, port: int) -> str:
    """How a client on this machine reaches the server."""
    host = options.host or "127.0.0.1"
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if options.tls_cert else 'http'}://{host}:{port}"


def _check_settings() -> None:
    """Read once now each setting the server reads later (per connection, per upload, per prune): a
    bad one stops the start with one line, rather than failing every request that reads it."""
    from corral.controller.protocol import body_window_seconds, head_seconds
    from corral.limits import send_limit
    from corral.login_env import login_env_seconds
    from corral.run_files import cache_keep_days, caches_interval_seconds, grace_seconds, interval_seconds, keep_days
    from corral.uploads import keep_days_setting

    for read in (head_seconds, body_window_seconds, send_limit, login_env_seconds, keep_days_setting,
                 default_timeout, grace_seconds, interval_seconds, keep_days, cache_keep_days,
                 caches_interval_seconds):
        read()


async def _run(options: ServerOptions, ready_fd: int | None = None) -> None:
    """The loop: tick, then wait; faster while jobs are on the move, slower when idle or on errors.
    The API serves on the same event loop, between and during ticks' remote calls."""
    import asyncio
    import secrets

    import uvicorn

    from corral.client import Client
    from corral.controller.api import ControllerStatus, TickFigures, create_app
    from corral.controller.engine import LEASE, Controller, ControllerSettings
    from corral.controller.protocol import MAX_REQUEST_HEAD, RefusingH11Protocol
    from corral import locks, run_files
    from corral.sdk.endpoint import settings as endpoint_settings
    from corral.state import open_store
    from corral.usage import UsageSampler

    _check_settings()
    store = open_store()
    if options.team:  # each user's jobs reach the clusters as their own account (accounts.py)
        from corral import accounts

        submit = accounts.team_settings()
        accounts.install(accounts.TeamAccounts(store, submit))
        print("submit as: " + ", ".join(f"{c}={submit.describe(c)}" for c in Client().registry.names()),
              flush=True)
    holder = f"{socket.gethostname()}:{os.getpid()}"
    previous = _crashed_holder()
    if previous is not None:  # its leases would keep its clusters undriven until they lapse
        store.release_leases(previous)
        print(f"released the leases of {previous}, this home's previous server, which is no longer running",
              flush=True)
    controller = Controller(Client(), store, holder, ControllerSettings.from_env())
    base = env_number("CORRAL_CONTROLLER_INTERVAL", 5.0, minimum=0.1)
    sampler = UsageSampler.from_env()
    status = ControllerStatus(pid=os.getpid(), holder=holder, started_at=time.time(), interval=base,
                              wake=asyncio.Event())
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGINT, stopping.set)
    loop.add_signal_handler(signal.SIGUSR1, status.wake.set)  # new work: tick now

    listener = _listener(options)
    token = secrets.token_urlsafe(32)
    app = create_app(status, store, token, controller.refreshes, sso_header=options.sso_header,
                     trusted_proxies=options.trusted_proxies, access_log=options.team)
    first_request = asyncio.Event()
    asgi_app = app if ready_fd is None else _noting_first_request(app, first_request)  # for the wait below
    config = uvicorn.Config(asgi_app, log_level="warning", access_log=False, http=RefusingH11Protocol,
                            lifespan="off", ssl_certfile=options.tls_cert, ssl_keyfile=options.tls_key,
                            h11_max_incomplete_event_size=MAX_REQUEST_HEAD)
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
    port = listener.getsockname()[1]
    url = _local_url(options, port)
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "port": port, "token": token, "settings": endpoint_settings(),
                   **({"team": True, "url": url, "cafile": options.tls_cert, "options": options.to_env()}
                      if options.team else {})}, f)
    write_private(pid_file(), f"{os.getpid()}\n")  # `start` returns once told: by then the API answers
    tell_ready(ready_fd)
    served = f"team server on {options.host or '127.0.0.1'}:{port}" if options.team else f"API on 127.0.0.1:{port}"
    print(f"corral controller {holder} started (interval {base:g}s, {served})", flush=True)
    if ready_fd is not None:  # started for a command: serve it first (a tick over many jobs holds the loop)
        await _first_of(first_request, stopping, timeout=FIRST_TICK_WAIT)
    interval = base
    # Renewed (by their holder) and looked at (by the other replicas) well within one lease period: a
    # lease never lapses between its holder's ticks, and another replica takes it soon after it does.
    longest = min(max(MAX_INTERVAL, base), controller.settings.lease_seconds / 3)
    pruned_at = -math.inf
    files_every = run_files.interval_seconds()
    files_at = time.monotonic() - files_every + min(run_files.FIRST_PASS, files_every)  # the first pass's due
    caches_every, caches_at = run_files.caches_interval_seconds(), -math.inf  # the first with the first pass
    disagreement: str | None = None
    failing: list[str] = []  # the clusters the last tick could not refresh
    try:
        while not stopping.is_set():
            started = time.monotonic()
            if started - pruned_at > PRUNE_INTERVAL:
                pruned_at = started
                _prune_uploads(store)
                try:
                    controller.shards.forget_gone_replicas()  # heartbeats of replicas gone for a day
                    store.forget_leases(locks.STORE_LOCK, expired_before=time.time() - FORGET_LOCKS_AFTER)
                except Exception as exc:  # noqa: BLE001 - housekeeping: never a reason to stop driving jobs
                    print(f"forgetting gone replicas and lapsed locks failed: {exc!r}", flush=True)
            try:
                report = await controller.tick()
                status.ticks += 1
                if report.chores and sampler.due(time.monotonic()):  # one replica samples: the chores' holder
                    await sampler.sample(Client(), store)
                if report.chores and time.monotonic() - files_at > files_every:
                    files_at = time.monotonic()
                    caches = files_at - caches_at > caches_every
                    caches_at = files_at if caches else caches_at
                    await _remove_run_files(controller.client, store, caches=caches)
                status.last_tick = TickFigures(at=time.time(), seconds=round(time.monotonic() - started, 4),
                                               drove=report.drove, jobs=report.jobs, submitted=report.submitted,
                                               moved=report.moved, cancelled=report.cancelled,
                                               submitting=report.submitting,
                                               round_trips=report.round_trips, errors=report.errors,
                                               disagreement=report.disagreement)
                if report.disagreement != disagreement:  # said once when it starts, and when it ends
                    disagreement = report.disagreement
                    print(disagreement or "replicas read the same cluster list again: driving jobs", flush=True)
                if report.jobs or report.queued_execs or report.submitting:  # work: the configured pace,
                    # even while a cluster fails. A failing cluster is held back by its own budget and
                    # back-off (budget.py); a loop that slowed for it (it did, to 10 s) saw every job late,
                    # its recovery included.
                    interval = base
                else:  # nothing to drive: slow down
                    interval = min(longest, max(base, interval * 1.5))
                failing_before, failing = failing, sorted(report.errors)  # said when it changes, not each tick
                if report.drove and (report.submitted or report.moved or report.cancelled or failing != failing_before):
                    print(f"tick: jobs={report.jobs} submitted={report.submitted} moved={report.moved} "
                          f"cancelled={report.cancelled} trips={report.round_trips} errors={report.errors}",
                          flush=True)
            except Exception as exc:  # one bad tick must not stop recovery of every job
                print(f"tick failed: {exc!r}", flush=True)
                interval = min(longest, interval * 2)
            _return_free_memory()
            status.interval = interval
            remaining = max(0.0, interval - (time.monotonic() - started))
            lapse = controller.shards.seconds_to_next_lapse()
            if lapse is not None:  # another replica's lease lapses sooner: be there to take its clusters
                remaining = min(remaining, lapse + LAPSE_MARGIN)
            await _first_of(status.wake, stopping, timeout=remaining)
            if status.wake.is_set():
                status.wake.clear()
                interval = base
    finally:
        # A submission cut short would leave its job to be placed again by the replica taking its home: the
        # homes of those that outlast the wait stay leased until the leases lapse.
        unfinished = await controller.finish_submissions(STOP_SUBMIT_WAIT)
        api.should_exit = True
        await serving
        store.release_lease(LEASE, holder)
        controller.shards.release_all(keep=unfinished)  # the other replicas take its clusters on their next tick
        if running_pid() == os.getpid():
            pid_file().unlink(missing_ok=True)
            endpoint.unlink(missing_ok=True)


STOP_SUBMIT_WAIT = 10.0  # seconds a stopping server waits for its submissions (`server stop` waits 20 s)
FIRST_TICK_WAIT = 1.0  # seconds a server started for a command waits for that command's request to end
FORGET_LOCKS_AFTER = 86400.0  # a store lock a dead holder left is removed this long after it lapsed
PRUNE_INTERVAL = 3600.0  # seconds between removals of old uploads and of long-gone replicas' heartbeats
LAPSE_MARGIN = 0.05  # seconds after another replica's lease lapses before the tick that may take it


async def _remove_run_files(client: Any, store: Any, *, caches: bool = False) -> None:
    """The ended attempts' env.sh on the clusters, ended job groups' host files, with `run_dirs:
    {keep_days: N}` old run directories, and with `caches` the workdir caches unused for long
    (run_files.py); said in the log when anything goes."""
    from corral import run_files

    now, grace = time.time(), run_files.grace_seconds()  # checked at the start
    try:
        days = run_files.keep_days()
        cache_days = run_files.cache_keep_days()
    except CorralError as exc:  # config.yaml changed since the start: the env files go all the same
        print(f"not removing old run directories or workdir caches: {exc}", flush=True)
        days = cache_days = None
    # (what one pass removes, as the log says it with a count; the pass)
    passes = [("env.sh from {} ended jobs' run directories",
               lambda: run_files.remove_env_files(client, store, now, grace=grace)),
              ("the host files of {} ended job groups", lambda: run_files.remove_group_dirs(client, store, now,
                                                                                          grace=grace))]
    if days is not None:
        passes.append(("the whole of {} ended jobs' run directories",
                       lambda: run_files.remove_run_dirs(client, store, now, days, grace=grace)))
    if caches and cache_days is not None:
        passes.append((f"{{}} workdir caches unused for {cache_days:g} days",
                       lambda: run_files.prune_workdir_caches(client, store, cache_days)))
    for what, removal in passes:
        try:
            report = await removal()
        except Exception as exc:  # noqa: BLE001 - housekeeping: never a reason to stop driving jobs
            print(f"removing {what.format('the')} failed: {exc!r}", flush=True)
            continue
        for cluster, count in sorted(report.removed.items()):
            print(f"removed {what.format(count)} on {cluster}", flush=True)
        for cluster, error in sorted(report.errors.items()):
            print(f"could not remove {what.format('the')} on {cluster} (next pass tries again): {error}", flush=True)


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


def _noting_first_request(app: Any, done: Any) -> Any:
    """The ASGI app, which sets `done` (an asyncio.Event) when an HTTP request has been answered."""

    async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                done.set()

    return serve


async def _first_of(*events: Any, timeout: float) -> None:
    """Wait until one of these asyncio events is set, or `timeout` seconds."""
    import asyncio

    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


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
