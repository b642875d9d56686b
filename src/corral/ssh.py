"""The SSH transport: the system OpenSSH client, one ControlMaster connection per cluster.

Every call is `ssh -F <corral ssh config> -- <cluster> bash --login -s` with the script on stdin, so no
user text is ever spliced into a remote command line (after the first, `bash --noprofile --norc -s` with
the login shell's environment exported first: login_env.py). The first call to a cluster becomes the master
(`ControlMaster=auto`, `ControlPersist`), later calls reuse its socket for ~25 ms round trips instead of
~300 ms handshakes, and it works the same behind ProxyJump because ssh multiplexes the final hop.

Corral's ssh options are defaults, never overrides: the config file handed to `ssh -F` includes the
user's cluster file first and Corral's `Host *` block after it, and ssh keeps the first value it reads
for each option. One timeout (`CORRAL_TIMEOUT`, default 10 s) bounds every wait on a login node that
stops answering: the connect timeout and the keepalives (which end a stuck ControlMaster) derive from it.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.accounts import Login, SubmitMode
from corral.budget import Budget, budget_for
from corral.config import (
    MACHINE,
    ClusterRegistry,
    check_timeout,
    corral_home,
    default_timeout,
    private_dir,
    write_private,
)
from corral.errors import (
    ClusterBusyError,
    ClusterError,
    ClusterUnreachableError,
    ConfigError,
    CorralError,
    HostKeyError,
    RemoteCommandError,
    SshAuthError,
    SshTimeoutError,
)
from corral.login_env import CAPTURE, LOGIN_ENVS, LoginEnv, split_capture
from corral.pacing import keep_pace

SSH_FAILURE = 255
NO_SUCH_FOLDER = 3  # how a tar stream of a folder ends when there is no such folder
COMMAND_NOT_FOUND = 127
# rsync's quick check (size and time) compares whole seconds by default: a file rewritten at the same
# size within the same second as its last copy would be taken for unchanged, and a job would run the
# old code. A negative window compares nanoseconds too (on receivers from rsync 3.1.3, of 2018).
EXACT_TIMES = "--modify-window=-1"


class CorralFileError(CorralError):
    """A local file the task names does not exist or cannot be read."""
  # ssh's own exit status; anything else is the remote command's
_CONFIG_LINE_ERROR = re.compile(r"^(?P<path>.+?):? line (?P<line>\d+): (?P<msg>.+?)\s*$", re.M)
_UNIX_SOCKET_MAX = 100


@dataclass(frozen=True)
class RemoteResult:
    cluster: str
    exit_status: int
    stdout: str
    stderr: str
    seconds: float


def control_dir() -> Path:
    """Where the ControlMaster sockets live; short enough for the unix socket path limit."""
    path = corral_home() / "ssh"
    if len(str(path)) + 42 > _UNIX_SOCKET_MAX:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        path = Path(f"/tmp/corral-ssh-{os.getuid()}-{digest}")
    return private_dir(path)


def ssh_defaults(timeout: float, control_persist_seconds: int, sockets: Path) -> dict[str, str]:
    """Corral's ssh options, all overridable per host in the user's own file. A login node that stops
    answering behind an open master is found by the master's keepalives: ServerAliveInterval x
    (ServerAliveCountMax + 1) stays within `timeout`."""
    seconds = max(1, math.floor(timeout))
    return {
        "BatchMode": "yes",
        "LogLevel": "ERROR",
        "ConnectTimeout": str(min(5, seconds)),
        "ServerAliveInterval": str(max(1, seconds // 3)),
        "ServerAliveCountMax": "2",
        "ControlMaster": "auto",
        "ControlPath": _config_word(f"{sockets}/%C", tokens=True),
        "ControlPersist": str(control_persist_seconds),
    }


def _config_word(value: str, tokens: bool = False) -> str:
    """A value for an ssh_config line. `tokens`: the value's own %-tokens are meant (ControlPath)."""
    if '"' in value or any(c in value for c in "\r\n"):
        raise ConfigError(f"path {value!r} cannot be written into an ssh config (it holds a quote or newline)")
    if not tokens:
        value = value.replace("%", "%%")
    return f'"{value}"' if any(c.isspace() for c in value) else value


# What Corral's calls must have whatever the user's file says: a RemoteCommand of the user's own (a
# `tmux attach`, a `bash -l` for interactive logins) would replace Corral's script ("Cannot execute
# command-line and remote command"), and a forced TTY would garble it. `-t` (an interactive `corral ssh`)
# still wins: options on the command line come first.
FORCED = {"RemoteCommand": "none", "RequestTTY": "no"}


def write_ssh_config(cluster_file: Path, defaults: dict[str, str], where: Path) -> Path:
    """The file handed to `ssh -F`: FORCED, then the user's cluster file, so its settings win over the
    rest, then Corral's defaults for every host. Written once per distinct content (mode 600), atomically."""
    text = (
        "# Written by Corral. ssh keeps the first value it reads for each option: the two below are\n"
        "# Corral's own calls' (a remote command or a forced TTY of yours would replace or garble their\n"
        "# scripts); then your cluster file, so your settings win, and the last block only fills in what\n"
        "# you did not set.\n"
        "Host *\n" + "".join(f"    {key} {value}\n" for key, value in FORCED.items()) +
        f"Include {_config_word(str(cluster_file.resolve()))}\n"
        "Host *\n" + "".join(f"    {key} {value}\n" for key, value in defaults.items())
    )
    path = where / f"config-{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    return path if path.exists() else write_private(path, text)


# Sessions open per cluster, per event loop: shared by every transport of the process (the server makes
# one per request), so a burst of requests never opens more than the limit on one login node.
_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = \
    weakref.WeakKeyDictionary()


async def _within_budget(cluster: str, allowance: Budget, cost: int, timeout: float, poll: bool = False) -> None:
    """Wait for the cluster's budget to allow `cost` commands; ClusterBusyError past `timeout`, and at
    once for a `poll` while the controller's back-off lasts."""
    deadline = time.monotonic() + timeout
    while (wait := allowance.wait_seconds(cost)) > 0:
        if time.monotonic() + wait > deadline or (poll and allowance.backing_off()):
            raise ClusterBusyError(cluster, allowance.why_short(wait))
        allowance.waiting += 1
        try:
            await asyncio.sleep(min(wait, 1.0))
        finally:
            allowance.waiting -= 1
    allowance.spend(cost)


def _session_limit(cluster: str, size: int) -> asyncio.Semaphore:
    limits = _SESSIONS.setdefault(asyncio.get_running_loop(), {})
    return limits.setdefault(cluster, asyncio.Semaphore(size))


class _Opening:
    """A master open_masters is opening: done once it is up or has failed. Set from its thread; awaited
    on the server's event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def finish(self) -> None:
        with self._lock:
            self._done, waiters, self._waiters = True, self._waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(lambda f=future: f.done() or f.set_result(None))
            except RuntimeError:  # that loop has closed meanwhile: nobody waits there any more
                pass

    async def wait(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._done:
                return
            self._waiters.append((loop, future))
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            with self._lock:
                if (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))


# Masters being opened ahead, by (ssh config, cluster). ControlMaster=auto binds the socket only once the
# master has logged in, so a call made meanwhile would log in a second time beside it (and fail to become
# the master): a handshake more, and a second session on a login node that may count them.
_OPENING: dict[tuple[str, str], _Opening] = {}


def open_masters(registry: ClusterRegistry, clusters: list[str]) -> None:
    """Open a ControlMaster to each cluster in the background (`ssh -N -f`: a connection, no remote
    command; it returns once the master is up or has failed). A starting server calls this before it
    loads its modules, so the handshakes overlap that. A cluster that does not answer costs nothing
    here: its first call reports it. Only where the effective ssh config (`ssh -G`) keeps masters:
    elsewhere `-N -f` would leave an idle connection behind. A call that comes while its cluster's
    master is being opened waits for it (SshTransport._after_opening)."""
    transport = SshTransport(registry)
    config = str(transport.config_file)
    openings = {name: _Opening() for name in clusters}
    _OPENING.update({(config, name): opening for name, opening in openings.items()})

    def open_all() -> None:
        pending: dict[str, subprocess.Popen[bytes]] = {}
        try:
            asked = [(name, subprocess.Popen(transport.ssh_argv(name, [], ("-G",)), stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)) for name in clusters]
            for name, answer in asked:
                if keeps_masters(ssh_settings(answer.communicate()[0].decode(errors="replace"))):
                    pending[name] = subprocess.Popen(transport.ssh_argv(name, [], ("-N", "-f")),
                                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                     stderr=subprocess.DEVNULL)
                else:
                    openings[name].finish()
            while pending:  # each as it ends, whatever the order
                for name in [name for name, proc in pending.items() if proc.poll() is not None]:
                    del pending[name]
                    openings[name].finish()
                time.sleep(0.01)
        except OSError:
            pass  # no ssh: the first call says so
        finally:
            for opening in openings.values():
                opening.finish()

    threading.Thread(target=open_all, daemon=True).start()


def stop_masters(sockets: Path, command: str = "stop") -> int:
    """`ssh -O stop` (or `exit`) every ControlMaster whose socket is in `sockets` (Corral's own,
    control_dir: never a user's); returns how many answered. `stop`: a master takes no new session and
    ends with its last one (an idle one at once; a `corral ssh` session or a follow goes on to its end).
    `exit`: at once, sessions and all. All are asked at the same time; each has 5 s. A socket still
    there afterwards (a master slow to answer on a loaded host, or one that an ssh started while the
    others stopped: ControlMaster=auto makes a session its own master when it finds no socket) is asked
    once more. A socket no master listens on any more (its master died) is removed."""
    answered = 0
    for _ in range(2):
        try:
            found = [sock for sock in sockets.iterdir() if sock.is_socket()]
        except OSError:
            return answered
        if not found:
            return answered
        answered += _ask_masters(found, command)
    for sock in found:
        _remove_if_stale(sock)
    return answered


def _remove_if_stale(path: Path) -> None:
    """Remove a control socket that refuses connections: its master is gone (a live one accepts)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink(missing_ok=True)
        except OSError:
            pass  # gone already, or busy: left as it is


def _ask_masters(found: list[Path], command: str) -> int:
    ssh = shutil.which("ssh") or "ssh"
    try:
        asked = [subprocess.Popen([ssh, "-o", f"ControlPath={sock}", "-O", command, "x"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for sock in found]
    except OSError:
        return 0  # no ssh: then no master either
    answered = 0
    for proc in asked:
        try:
            answered += proc.wait(timeout=5) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return answered


def ssh_settings(text: str) -> dict[str, list[str]]:
    """`ssh -G` output by lowercase keyword; a keyword may come more than once (IdentityFile, …)."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key, []).append(value)
    return settings


def keeps_masters(settings: dict[str, list[str]]) -> bool:
    """Whether effective ssh settings (`ssh_settings`) make a connection a ControlMaster that goes away
    on its own (ControlMaster yes or auto, a ControlPath, and ControlPersist not `no`)."""
    def first(key: str, default: str) -> str:
        return (settings.get(key) or [default])[0]

    return (first("controlmaster", "false") in ("auto", "true") and first("controlpath", "none") != "none"
            and first("controlpersist", "no") != "no")


class SshTransport:
    """Runs scripts on clusters' login nodes. Safe to share across tasks of one event loop."""

    def __init__(
        self,
        registry: ClusterRegistry,
        *,
        timeout: float | None = None,
        control_persist_seconds: int = 600,
        max_sessions_per_cluster: int = 8,
    ):
        self.registry = registry
        self.timeout = check_timeout(float(timeout)) if timeout is not None else default_timeout()
        self.control_persist_seconds = control_persist_seconds
        self.max_sessions_per_cluster = max_sessions_per_cluster
        self.round_trips: Counter[str] = Counter()
        self._no_remote_rsync: set[str] = set()
        # Where rsync lives on the clusters (sites with it outside PATH set CORRAL_REMOTE_RSYNC).
        self.remote_rsync = os.environ.get("CORRAL_REMOTE_RSYNC", "rsync")
        self._config: Path | None = None
        self.login: Login | None = None  # acting as a team member (accounts.py); None: as ssh config says

    def acting_as(self, login: Login | None) -> SshTransport:
        """The same transport acting as one team member: their own account and key (`ssh`: a
        ControlMaster of their own), or `sudo -n -u USER` through the service account's connection
        (`sudo`). Round-trip counts are shared."""
        if login is None:
            return self
        other = copy.copy(self)
        other.login = login
        return other

    def _acting(self, mode: SubmitMode) -> str | None:
        """The member's account when acting as one in `mode`, else None."""
        return self.login.user if self.login is not None and self.login.mode is mode else None

    def _login_options(self) -> tuple[str, ...]:
        """`ssh` mode: the member's account and key only (not the agent, not the config's keys first)."""
        user = self._acting(SubmitMode.SSH)
        if user is None or self.login is None:
            return ()
        return ("-l", user, "-i", str(self.login.identity), "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none")

    def as_user(self, remote: list[str]) -> list[str]:
        """The remote command, run as the member under `sudo` mode (the words are shell-quoted: ssh
        joins them into one command line for the login node's shell)."""
        user = self._acting(SubmitMode.SUDO)
        return remote if user is None else ["sudo", "-n", "-H", "-u", shlex.quote(user), "--", *remote]

    def _login_env_key(self, cluster: str) -> tuple[str, ...] | None:
        """Whose login environment a call on `cluster` runs in (login_env.py). None under `sudo`: the
        sites' sudoers rule (docs/sudoers.example) names `bash --login -s`, so that stays."""
        if self._acting(SubmitMode.SUDO) is not None:
            return None
        acting = (self.login.mode.value, self.login.user) if self.login is not None else ("", "")
        return (str(self.config_file), cluster, *acting)

    def _shell(self, env_key: tuple[str, ...] | None, script: str, capture: bool = True) -> tuple[list[str], str]:
        """The remote shell and the script it reads: a plain bash with the login environment exported
        first once it is known, else a login shell that also writes its environment when `capture`
        (login_env.py; not where stderr is read only at the end, as a stream's: a large environment
        would fill the pipe)."""
        known = _learned(env_key)
        if known:
            return ["bash", "--noprofile", "--norc", "-s"], known.script + self._from_home(script)
        return ["bash", "--login", "-s"], (CAPTURE if env_key and capture else "") + self._from_home(script)

    def login_notes(self, cluster: str) -> dict[str, Any] | None:
        """What callers keep about `cluster`'s login node for as long as its learned login environment
        (login_env.LoginEnv.notes); None while none is known (not yet, expired, or under `sudo`)."""
        known = _learned(self._login_env_key(cluster))
        return known.notes if known else None

    @staticmethod
    def _learn(env_key: tuple[str, ...] | None, stderr: str, status: int) -> str:
        """Keep a login environment the call wrote; forget it when a command was not found (the profile
        may have changed). Returns stderr without the environment."""
        captured, rest = split_capture(stderr)
        if env_key and captured is not None:
            LOGIN_ENVS.learn(env_key, captured)
        elif env_key and status == COMMAND_NOT_FOUND:
            LOGIN_ENVS.forget(env_key)
        return rest

    async def _after_opening(self, cluster: str, timeout: float) -> float:
        """Wait, at most `timeout`, for the master open_masters may still be opening to `cluster`
        (the service account's: a member in `ssh` mode has masters of their own); returns the seconds
        waited, which the call's own bound includes."""
        opening = None if self._login_options() else _OPENING.get((str(self.config_file), cluster))
        if opening is None:
            return 0.0
        started = time.monotonic()
        await opening.wait(timeout)
        return time.monotonic() - started

    def _from_home(self, script: str) -> str:
        """sudo keeps the service account's working directory; a member's script starts in their home."""
        return script if self._acting(SubmitMode.SUDO) is None else "cd || exit 1\n" + script

    def _connection(self, cluster: str) -> str:
        """Sessions are limited per connection: per cluster, and per member in `ssh` mode."""
        return f"{cluster} {self.login.user}" if self._login_options() and self.login else cluster

    @property
    def config_file(self) -> Path:
        """The ssh config Corral hands to `ssh -F` (the user's cluster file, then Corral's defaults)."""
        if self._config is None:
            sockets = control_dir()
            defaults = ssh_defaults(self.timeout, self.control_persist_seconds, sockets)
            self._config = write_ssh_config(self.registry.path, defaults, private_dir(corral_home() / "transport"))
        return self._config

    def ssh_argv(self, cluster: str, remote: list[str], options: tuple[str, ...] = ()) -> list[str]:
        """`ssh [options] -- CLUSTER REMOTE…`. The cluster comes after `--`, so no name is read as an option."""
        ssh = shutil.which("ssh") or "ssh"
        return [ssh, "-F", str(self.config_file), *self._login_options(), *options, "--", cluster, *remote]

    async def run(self, cluster: str, script: str, *, timeout: float, check: bool = True,
                  cost: int = 1, poll: bool = False) -> RemoteResult:
        """Run a bash script on the cluster's login node in one round trip, which runs `cost` Slurm
        commands (budget.py: it waits for them within `timeout`, and backs off a busy controller; a
        `poll`, which the next tick repeats anyway, does not wait out a back-off).

        Raises a ClusterError subclass that names the cluster when ssh itself fails, when the call
        exceeds `timeout` seconds, or (with `check`) when the script exits non-zero.
        """
        entry = self.registry.get(cluster)
        allowance = budget_for(cluster)
        await _within_budget(cluster, allowance, cost, timeout, poll)
        given = timeout
        timeout -= await self._after_opening(cluster, timeout)
        if timeout <= 0:
            raise SshTimeoutError(cluster, "no answer from the login node: its connection did not open in time")
        # The remote side enforces the limit too, so nothing we gave up on keeps running there.
        remote_limit = str(math.ceil(timeout) + 1)
        env_key = self._login_env_key(cluster)
        shell, script = self._shell(env_key, script)
        argv = self.ssh_argv(entry.name, ["timeout", "-k", "2", remote_limit, *self.as_user(shell)])
        async with _session_limit(self._connection(cluster), self.max_sessions_per_cluster):
            started = time.monotonic()
            self.round_trips[cluster] += 1
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(script.encode()), timeout)
            except asyncio.TimeoutError:
                await _kill(proc)
                await self.stop_master(cluster)
                raise SshTimeoutError(
                    cluster, f"no answer from the login node within {given:.3g}s"
                ) from None
            except asyncio.CancelledError:
                await _kill(proc)
                raise
        status = _status(proc)
        result = RemoteResult(
            cluster=cluster,
            exit_status=status,
            stdout=out.decode(errors="replace"),
            stderr=self._learn(env_key, err.decode(errors="replace"), status),
            seconds=time.monotonic() - started,
        )
        allowance.answered(result.stdout + result.stderr)
        if result.exit_status == SSH_FAILURE:
            raise self.classify_failure(cluster, result.stderr)
        refused = self._sudo_refusal(result.stderr) if result.exit_status == 1 else None
        if refused:
            raise SshAuthError(cluster, refused)
        if check and result.exit_status != 0:
            raise RemoteCommandError(
                cluster,
                f"remote command failed with exit status {result.exit_status}: "
                f"{_last_line(result.stderr) or 'no error output'}",
                exit_status=result.exit_status,
                stderr=result.stderr,
            )
        return result

    def _sudo_refusal(self, stderr: str) -> str | None:
        """`sudo` mode: sudo's own refusal (no rule for this account, a password asked), in words."""
        user = self._acting(SubmitMode.SUDO)
        lines = [line for line in stderr.splitlines() if line.startswith(("sudo:", "Sorry, user"))]
        if user is None or not lines:
            return None
        return (f"sudo on the login node would not act as {user} ({lines[-1].strip()}): the service "
                "account needs the sudoers rule of docs/sudoers.example, with that account in its group")

    def classify_failure(self, cluster: str, stderr: str) -> CorralErrorLike:
        """Turn ssh's own error output into one clear error naming the cluster."""
        entry = self.registry.get(cluster)
        node = "machine" if entry.kind == MACHINE else "login node"  # a pool's machine has no login node
        text = stderr.replace("\r", "").strip()
        member = self._acting(SubmitMode.SSH)
        if "Permission denied" in text and member is not None:
            return SshAuthError(
                cluster,
                f"the {node} refused the team server's key for {member} ({_last_line(text)}): "
                f"{member} adds it once, with `corral api ssh-key >> ~/.ssh/authorized_keys` run on "
                f"{cluster} (or pasted there)")
        config_error = _CONFIG_LINE_ERROR.search(text)
        if config_error:
            return ConfigError(config_error.group("msg"), Path(config_error.group("path")),
                               int(config_error.group("line")))
        if "Could not resolve hostname" in text:
            host = entry.hostname or entry.name
            hint = (f"set HostName for Host {entry.name} ({entry.where})" if entry.hostname is None
                    else f"check HostName {host} of Host {entry.name} ({entry.where})")
            return ClusterUnreachableError(cluster, f"{node} address {host!r} does not resolve; {hint}")
        if "Permission denied" in text:
            return SshAuthError(
                cluster,
                f"the {node} refused our key ({_last_line(text)}); check User and IdentityFile "
                f"for Host {entry.name} ({entry.where}), and that ssh-agent or the key file is usable",
            )
        if ("Host key verification failed" in text or "HOST IDENTIFICATION HAS CHANGED" in text
                or "host key is known" in text):
            return HostKeyError(
                cluster,
                f"the {node}'s host key is unknown or changed; verify it, then add it to known_hosts "
                f"(e.g. `ssh -F {self.registry.path} {entry.name}` once)",
            )
        if "Connection refused" in text:
            return ClusterUnreachableError(cluster, f"{node} refused the connection (is sshd running?)")
        if "timed out" in text.lower():
            return ClusterUnreachableError(cluster, f"connection to the {node} timed out ({_last_line(text)})")
        if not _last_line(text):  # a shared connection that died, or a peer that stopped answering keepalives
            return ClusterUnreachableError(cluster, f"lost the connection to the {node} (ssh exited 255 "
                                                    "and said nothing); is it up? `corral check` tells")
        return ClusterUnreachableError(cluster, f"ssh failed: {_last_line(text)}")

    async def stream(self, cluster: str, script: str, on_output: Callable[[bytes], None]) -> int:
        """Run a long script (e.g. following a log), passing its stdout to `on_output` as it comes.

        No timeout: the script decides when to end. Returns the remote exit status.
        """
        self.registry.get(cluster)
        await self._after_opening(cluster, self.timeout)
        env_key = self._login_env_key(cluster)
        shell, script = self._shell(env_key, script, capture=False)
        argv = self.ssh_argv(cluster, self.as_user(shell))
        self.round_trips[cluster] += 1
        proc = await _spawn_copy(
            argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        assert proc.stdin and proc.stdout and proc.stderr
        proc.stdin.write(script.encode())
        proc.stdin.close()
        try:
            while chunk := await proc.stdout.read(65536):
                on_output(chunk)
                await keep_pace()
            err = await proc.stderr.read()
            status = await proc.wait()
        except asyncio.CancelledError:
            await _kill(proc)
            raise
        stderr = self._learn(env_key, err.decode(errors="replace"), status)
        if status == SSH_FAILURE:
            raise self.classify_failure(cluster, stderr)
        return status

    async def sync(self, cluster: str, source: Path, destination: str, *, timeout: float = 600,
                   mirror: bool = False, hold: str | None = None) -> None:
        """Copy a local file or directory to the cluster over the cluster's ControlMaster.

        `destination` is relative to the remote home (or absolute); a directory's contents are copied
        into it, and with `mirror` what is no longer in `source` is deleted there. rsync when both sides
        have it (only changes travel), else a tar stream, which every site has. With `hold` (a file
        under the remote home), the same session first touches that file, then holds a shared lock on
        it (flock, where the site has it) while it writes (held_by).
        """
        if not source.exists():
            raise CorralFileError(f"{source}: no such file or directory to sync to {cluster}")
        if shutil.which("rsync") and cluster not in self._no_remote_rsync:
            if await self._rsync(cluster, source, destination, timeout, ["--delete"] if mirror else [], hold):
                return
            self._no_remote_rsync.add(cluster)
        await self._tar(cluster, source, destination, timeout, mirror, hold)

    async def sync_size(self, cluster: str, source: Path, destination: str, *, timeout: float = 120) -> int | None:
        """What `sync(…, mirror=True)` would send: rsync's own dry run (`--stats`, no data moves), in one
        session over the ControlMaster. None where rsync cannot tell (no rsync on either side)."""
        if not shutil.which("rsync") or cluster not in self.registry.hosts() or cluster in self._no_remote_rsync:
            return None
        ssh = " ".join(shlex.quote(a) for a in self.ssh_argv(cluster, [])[:-2])
        src = os.path.abspath(source) + ("/" if source.is_dir() else "")
        argv = ["rsync", "-a", "-s", EXACT_TIMES, "--dry-run", "--stats", "--delete", "-e", ssh,
                f"--rsync-path={self.remote_rsync}", "--", src, f"{cluster}:{destination}"]
        if self._acting(SubmitMode.SUDO) is not None:
            return None  # the member's side runs through sudo: the estimate is not worth that detour
        text, status = await self._transfer(cluster, argv, source, timeout, with_stdout=True)
        if status != 0:
            return None
        found = re.search(r"Total transferred file size: ([\d,.]+) bytes", text)
        return int(found.group(1).replace(",", "").replace(".", "")) if found else None

    async def _rsync(self, cluster: str, source: Path, destination: str, timeout: float,
                     options: list[str], hold: str | None = None) -> bool:
        """False if the cluster has no rsync; raises on any other failure."""
        ssh = " ".join(shlex.quote(a) for a in self.ssh_argv(cluster, [])[:-2])
        # An absolute source after `--`: a local name can never be read as an rsync option, and -s
        # (--protect-args) sends the remote path over the protocol, never through the remote shell.
        src = os.path.abspath(source) + ("/" if source.is_dir() else "")
        # Folders rsync makes (--mkpath) are private too.
        rsync_path = f"umask 077 && {self.remote_rsync}"
        if self._acting(SubmitMode.SUDO) is not None or hold:
            # sudo keeps the service account's working directory: the member's rsync starts from their
            # home. bash, whatever the account's login shell, for the hold's lock.
            rsync_path = " ".join(self.as_user(["bash", "-c", shlex.quote(
                f'umask 077 && cd && {held_by(hold)}exec {self.remote_rsync} "$@"'), "rsync"]))
        # Nothing Corral copies is for other accounts' eyes (run dirs are mode 700 too).
        argv = ["rsync", "-a", "-s", EXACT_TIMES, "--mkpath", "--chmod=go-rwx", "-e", ssh, f"--rsync-path={rsync_path}",
                *options, "--", src, f"{cluster}:{destination}"]
        text, status = await self._transfer(cluster, argv, source, timeout)
        if status == 0:
            return True
        if "command not found" in text or ("No such file or directory" in text and "rsync" in text):
            return False
        if status == 255 or "connection unexpectedly closed" in text:
            raise self.classify_failure(cluster, text)
        raise RemoteCommandError(cluster, f"copying {source} failed: {_last_line(text)}", exit_status=status,
                                 stderr=text)

    def _untar_argv(self, cluster: str, destination: str, mirror: bool = False, hold: str | None = None
                    ) -> list[str]:
        """ssh that unpacks a tar stream read from its stdin into `destination` (made private)."""
        target = remote_path(destination.rstrip("/") or ".")
        fresh = f"rm -rf {target} && " if mirror else ""
        remote = f"umask 077 && {held_by(hold)}{fresh}mkdir -p {target} && tar -xf - -C {target}"
        return self.ssh_argv(cluster, self.as_user(["bash", "-c", shlex.quote(remote)]))

    def _receive_argv(self, cluster: str, destination: str) -> list[str]:
        """ssh that unpacks a tar stream from its stdin into a new folder beside `destination`, then puts it
        in `destination`'s place: where two clusters share a home, the stream's source may be that very
        folder, which unpacking over it would empty before it is read (and no reader ever sees it half
        written)."""
        target = remote_path(destination.rstrip("/"))
        script = (f'umask 077 && mkdir -p "$(dirname {target})" && new=$(mktemp -d {target}.corral-in-XXXXXX) '
                  f'|| exit 1\nif tar -xf - -C "$new"; then rm -rf {target} && mv "$new" {target}; '
                  f'else status=$?; rm -rf "$new"; exit $status; fi\n')
        return self.ssh_argv(cluster, self.as_user(["bash", "-c", shlex.quote(script)]))

    def _tar_argv(self, cluster: str, remote_dir: str) -> list[str]:
        """ssh that writes a tar stream of `remote_dir`'s contents on its stdout; exit 3 when it is no folder."""
        target = remote_path(remote_dir.rstrip("/"))
        script = f"[ -d {target} ] || exit {NO_SUCH_FOLDER}\ntar -cf - -C {target} .\n"
        return self.ssh_argv(cluster, self.as_user(["bash", "-c", shlex.quote(script)]))

    async def _tar(self, cluster: str, source: Path, destination: str, timeout: float, mirror: bool = False,
                   hold: str | None = None) -> None:
        if source.is_dir():
            argv = self._untar_argv(cluster, destination, mirror, hold)
            local = ["tar", "-cf", "-", "-C", os.path.abspath(source), "--", "."]
        else:
            target = remote_path(destination.rstrip("/") or ".")
            remote = f'umask 077 && mkdir -p "$(dirname {target})" && cat > {target}'
            argv = self.ssh_argv(cluster, self.as_user(["bash", "-c", shlex.quote(remote)]))
            local = ["cat", "--", os.path.abspath(source)]
        self.round_trips[cluster] += 1
        try:
            packed, sent = await _piped(local, argv, timeout)
        except asyncio.TimeoutError:
            raise SshTimeoutError(cluster, f"copying {source} took longer than {timeout:g}s") from None
        if packed.status not in (0, -signal.SIGPIPE):  # (SIGPIPE: the ssh side ended first, and says why)
            raise CorralFileError(f"{source}: could not be read for copying to {cluster}: "
                                  f"{_last_line(packed.stderr)}")
        if sent.status == SSH_FAILURE:
            raise self.classify_failure(cluster, sent.stderr)
        if sent.status != 0:
            raise RemoteCommandError(cluster, f"copying {source} failed: {_last_line(sent.stderr)}",
                                     exit_status=sent.status, stderr=sent.stderr)

    async def host_settings(self, host: str) -> dict[str, list[str]]:
        """What `ssh -G` resolves for a host of the cluster file (HostName, User, ProxyJump, …), by
        lowercase keyword; no connection is made."""
        proc = await asyncio.create_subprocess_exec(
            "ssh", "-G", "-F", str(self.registry.path), "--", host,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        return ssh_settings(out.decode())

    async def fetch(self, cluster: str, remote_dir: str, local_dir: Path, *, timeout: float = 600) -> bool:
        """Copy a remote directory's contents into `local_dir` (a tar stream from ssh straight into a local
        tar: none of it passes through this process). False if it does not exist."""
        argv = self._tar_argv(cluster, remote_dir)
        self.round_trips[cluster] += 1
        made = not local_dir.exists()
        local_dir.mkdir(parents=True, exist_ok=True)
        try:
            sent, unpacked = await _piped(argv, ["tar", "-xf", "-", "-C", os.path.abspath(local_dir)], timeout)
        except asyncio.TimeoutError:
            raise SshTimeoutError(cluster, f"fetching {remote_dir} took longer than {timeout:g}s") from None
        if sent.status == NO_SUCH_FOLDER:
            if made:
                shutil.rmtree(local_dir, ignore_errors=True)
            return False
        self._check_sent(cluster, remote_dir, sent)
        if unpacked.status != 0:
            raise CorralFileError(f"could not unpack {remote_dir} from {cluster} into {local_dir}: "
                                  f"{_last_line(unpacked.stderr)}")
        return True

    async def copy_to(self, cluster: str, remote_dir: str, target: SshTransport, target_cluster: str,
                      destination: str, *, timeout: float = 600) -> bool:
        """`remote_dir`'s contents on `cluster` into `destination` on `target_cluster` (reached by `target`,
        which may act as another account): a tar stream from one ssh straight into the other through an
        OS pipe, so that nothing lands on this machine's disk or passes through this process. False if
        there is no such folder. A failure raises the error of the side that failed (its cluster named)."""
        producer = self._tar_argv(cluster, remote_dir)
        consumer = target._receive_argv(target_cluster, destination)
        self.round_trips[cluster] += 1
        target.round_trips[target_cluster] += 1
        try:
            sent, unpacked = await _piped(producer, consumer, timeout)
        except asyncio.TimeoutError:
            raise SshTimeoutError(cluster, f"copying {remote_dir} to {target_cluster} took longer than "
                                           f"{timeout:g}s") from None
        if sent.status == NO_SUCH_FOLDER:
            return False
        if unpacked.status == SSH_FAILURE:
            raise target.classify_failure(target_cluster, unpacked.stderr)
        self._check_sent(cluster, remote_dir, sent)
        if unpacked.status != 0:
            raise RemoteCommandError(target_cluster, f"unpacking {remote_dir} from {cluster} failed: "
                                                     f"{_last_line(unpacked.stderr)}", exit_status=unpacked.status,
                                     stderr=unpacked.stderr)
        return True

    def _check_sent(self, cluster: str, remote_dir: str, sent: Ended) -> None:
        """Raise what the ssh that sent `remote_dir` as a tar stream ran into, if anything."""
        if sent.status == SSH_FAILURE:
            raise self.classify_failure(cluster, sent.stderr)
        if sent.status not in (0, -signal.SIGPIPE):  # (SIGPIPE: the other side ended first, and says why)
            raise RemoteCommandError(cluster, f"sending {remote_dir} failed: {_last_line(sent.stderr)}",
                                     exit_status=sent.status)

    async def _transfer(self, cluster: str, argv: list[str], source: Path, timeout: float,
                        with_stdout: bool = False) -> tuple[str, int]:
        """(stderr, or stdout then stderr with `with_stdout`; exit status) of a local rsync."""
        self.round_trips[cluster] += 1
        proc = await _spawn_copy(argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                 stderr=asyncio.subprocess.PIPE)
        try:
            _out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            await _kill(proc)
            raise SshTimeoutError(cluster, f"copying {source} took longer than {timeout:g}s") from None
        text = (_out + err) if with_stdout else err
        return text.decode(errors="replace"), _status(proc)

    async def close(self, cluster: str) -> None:
        """Stop the cluster's ControlMaster, if any (the next call opens a new one)."""
        await self._control(cluster, "exit")

    async def stop_master(self, cluster: str) -> None:
        """Make the cluster's ControlMaster take no new sessions (those running go on), so that the
        next call connects afresh instead of queueing behind a master whose login node went silent."""
        await self._control(cluster, "stop")

    async def _control(self, cluster: str, command: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self.ssh_argv(cluster, [], ("-O", command)), stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL
        )
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except asyncio.TimeoutError:
            await _kill(proc)


CorralErrorLike = ClusterError | ConfigError


def _learned(env_key: tuple[str, ...] | None) -> LoginEnv | None:
    """The login environment learned for `env_key` and still in use; None for none (or no key: sudo)."""
    return LOGIN_ENVS.get(env_key) if env_key else None


def held_by(hold: str | None) -> str:
    """Bash that touches `hold` (a file under the home) and takes a shared lock on it for as long as
    the shell and what it runs live (fd 9, inherited), so that a remover that takes the lock
    exclusively (infra/caches.py) waits, or passes over the file's folder. Where flock is
    missing, or fails (a filesystem without locks), the touch alone remains, and the copy goes on
    after at most a minute's wait."""
    if not hold:
        return ""
    path = remote_path(hold)
    # `: >` (truncating the empty file sets its mtime on Linux) and `exec 9<` are bash's own: of the
    # hold's work, only flock starts a process, and mkdir the first time.
    return (f'{{ {{ : > {path}; }} 2>/dev/null || {{ mkdir -p "$(dirname {path})" && : > {path}; }}; }} && '
            f"exec 9<{path} && {{ flock -w 60 -s 9 2>/dev/null || true; }} && ")


def remote_path(path: str) -> str:
    """A remote path for the login node's shell, quoted: absolute as given, else under "$HOME"."""
    return shlex.quote(path) if path.startswith("/") else f'"$HOME"/{shlex.quote(path)}'


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill an ssh client without waiting for its pipes to close.

    A ControlMaster client hands its stdout/stderr to the master, which keeps them open until the
    remote command ends; waiting for EOF would wait for the very command we are giving up on.
    """
    if proc.returncode is None:
        proc.kill()
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
    try:
        await asyncio.wait_for(proc.wait(), 1)
    except asyncio.TimeoutError:
        pass


@functools.cache
def _dying_with_us() -> tuple[str, ...]:
    """The prefix that makes a long-running child (a copy, a followed log) die with this process however it
    ends, `kill -9` included: `setpriv --pdeathsig KILL` (util-linux 2.33+). Without it, a server killed
    during a checkpoint copy leaves the copy writing where the job's next holder writes its own. Empty
    where the machine has no such setpriv (macOS): there the child runs to its end."""
    argv = ("setpriv", "--pdeathsig", "KILL", "--")
    try:
        works = subprocess.run([*argv, "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        works = False
    return argv if works else ()


async def _spawn_copy(argv: list[str], **pipes: Any) -> asyncio.subprocess.Process:
    """A local copy, tunnel or stream: started so that it dies with this process (_dying_with_us)."""
    return await asyncio.create_subprocess_exec(*_dying_with_us(), *argv, **pipes)


@dataclass(frozen=True)
class Ended:
    """How a local process ended: its exit status and what it wrote to stderr."""

    status: int
    stderr: str


async def _piped(producer: list[str], consumer: list[str], timeout: float) -> tuple[Ended, Ended]:
    """`producer | consumer`, the data flowing through an OS pipe between them, never through this
    process (a checkpoint of many GB costs it no memory). Both are killed at the timeout, which is
    raised (asyncio.TimeoutError), and on cancellation."""
    read_end, write_end = os.pipe()
    try:
        first = await _spawn_copy(producer, stdin=asyncio.subprocess.DEVNULL, stdout=write_end,
                                  stderr=asyncio.subprocess.PIPE)
        try:
            second = await _spawn_copy(consumer, stdin=read_end, stdout=asyncio.subprocess.DEVNULL,
                                       stderr=asyncio.subprocess.PIPE)
        except BaseException:
            await _kill(first)
            raise
    finally:  # the children hold their ends now: the producer's EOF reaches the consumer once it exits
        os.close(read_end)
        os.close(write_end)
    try:
        (_, first_err), (_, second_err) = await asyncio.wait_for(
            asyncio.gather(first.communicate(), second.communicate()), timeout)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        await _kill(first)
        await _kill(second)
        raise
    return (Ended(_status(first), first_err.decode(errors="replace")),
            Ended(_status(second), second_err.decode(errors="replace")))


def _status(proc: asyncio.subprocess.Process) -> int:
    """A process's exit status; -1 while it has none (killed, not yet reaped)."""
    return proc.returncode if proc.returncode is not None else -1


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
