"""The SSH transport: the system OpenSSH client, one ControlMaster connection per cluster.

Every call is `ssh -F <cluster file> <cluster> bash --login -s` with the script on stdin, so no user
text is ever spliced into a remote command line. The first call to a cluster becomes the master
(`ControlMaster=auto`, `ControlPersist`), later calls reuse its socket for ~25 ms round trips instead of
~300 ms handshakes, and it works the same behind ProxyJump because ssh multiplexes the final hop.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import re
import shlex
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.config import ClusterRegistry, corral_home
from corral.errors import (
    ClusterError,
    ClusterUnreachableError,
    ConfigError,
    CorralError,
    HostKeyError,
    RemoteCommandError,
    SshAuthError,
    SshTimeoutError,
)

SSH_FAILURE = 255


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
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


class SshTransport:
    """Runs scripts on clusters' login nodes. Safe to share across tasks of one event loop."""

    def __init__(
        self,
        registry: ClusterRegistry,
        *,
        connect_timeout: float = 5.0,
        control_persist_seconds: int = 600,
        max_sessions_per_cluster: int = 8,
    ):
        self.registry = registry
        self.connect_timeout = connect_timeout
        self.control_persist_seconds = control_persist_seconds
        self.max_sessions_per_cluster = max_sessions_per_cluster
        self.round_trips: Counter[str] = Counter()
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._no_remote_rsync: set[str] = set()
        # Where rsync lives on the clusters (sites with it outside PATH set CORRAL_REMOTE_RSYNC).
        self.remote_rsync = os.environ.get("CORRAL_REMOTE_RSYNC", "rsync")
        self._control_dir: Path | None = None

    def ssh_argv(self, cluster: str, remote: list[str]) -> list[str]:
        if self._control_dir is None:
            self._control_dir = control_dir()
        ssh = shutil.which("ssh") or "ssh"
        return [
            ssh,
            "-F", str(self.registry.path),
            "-o", "BatchMode=yes",
            "-o", "LogLevel=ERROR",
            "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=2",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self._control_dir}/%C",
            "-o", f"ControlPersist={self.control_persist_seconds}",
            "--",
            cluster,
            *remote,
        ]

    async def run(self, cluster: str, script: str, *, timeout: float, check: bool = True) -> RemoteResult:
        """Run a bash script on the cluster's login node in one round trip.

        Raises a ClusterError subclass that names the cluster when ssh itself fails, when the call
        exceeds `timeout` seconds, or (with `check`) when the script exits non-zero.
        """
        entry = self.registry.get(cluster)
        # The remote side enforces the limit too, so nothing we gave up on keeps running there.
        remote_limit = str(math.ceil(timeout) + 1)
        argv = self.ssh_argv(entry.name, ["timeout", "-k", "2", remote_limit, "bash", "--login", "-s"])
        limit = self._limits.setdefault(cluster, asyncio.Semaphore(self.max_sessions_per_cluster))
        async with limit:
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
                raise SshTimeoutError(
                    cluster, f"no answer from the login node within {timeout:g}s"
                ) from None
            except asyncio.CancelledError:
                await _kill(proc)
                raise
        result = RemoteResult(
            cluster=cluster,
            exit_status=proc.returncode if proc.returncode is not None else -1,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            seconds=time.monotonic() - started,
        )
        if result.exit_status == SSH_FAILURE:
            raise self.classify_failure(cluster, result.stderr)
        if check and result.exit_status != 0:
            raise RemoteCommandError(
                cluster,
                f"remote command failed with exit status {result.exit_status}: "
                f"{_last_line(result.stderr) or 'no error output'}",
                exit_status=result.exit_status,
                stderr=result.stderr,
            )
        return result

    def classify_failure(self, cluster: str, stderr: str) -> CorralErrorLike:
        """Turn ssh's own error output into one clear error naming the cluster."""
        entry = self.registry.get(cluster)
        text = stderr.replace("\r", "").strip()
        config_error = _CONFIG_LINE_ERROR.search(text)
        if config_error:
            return ConfigError(config_error.group("msg"), Path(config_error.group("path")),
                               int(config_error.group("line")))
        if "Could not resolve hostname" in text:
            host = entry.hostname or entry.name
            hint = (f"set HostName for Host {entry.name} ({entry.where})" if entry.hostname is None
                    else f"check HostName {host} of Host {entry.name} ({entry.where})")
            return ClusterUnreachableError(cluster, f"login node address {host!r} does not resolve; {hint}")
        if "Permission denied" in text:
            return SshAuthError(
                cluster,
                f"the login node refused our key ({_last_line(text)}); check User and IdentityFile "
                f"for Host {entry.name} ({entry.where}), and that ssh-agent or the key file is usable",
            )
        if ("Host key verification failed" in text or "HOST IDENTIFICATION HAS CHANGED" in text
                or "host key is known" in text):
            return HostKeyError(
                cluster,
                "the login node's host key is unknown or changed; verify it, then add it to known_hosts "
                f"(e.g. `ssh -F {self.registry.path} {entry.name}` once)",
            )
        if "Connection refused" in text:
            return ClusterUnreachableError(cluster, "login node refused the connection (is sshd running?)")
        if "timed out" in text.lower():
            return ClusterUnreachableError(cluster, f"connection to the login node timed out ({_last_line(text)})")
        return ClusterUnreachableError(cluster, f"ssh failed: {_last_line(text) or 'no error output'}")

    async def stream(self, cluster: str, script: str, on_output: Callable[[bytes], None]) -> int:
        """Run a long script (e.g. following a log), passing its stdout to `on_output` as it comes.

        No timeout: the script decides when to end. Returns the remote exit status.
        """
        self.registry.get(cluster)
        argv = self.ssh_argv(cluster, ["bash", "--login", "-s"])
        self.round_trips[cluster] += 1
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        assert proc.stdin and proc.stdout and proc.stderr
        proc.stdin.write(script.encode())
        proc.stdin.close()
        try:
            while chunk := await proc.stdout.read(65536):
                on_output(chunk)
            err = await proc.stderr.read()
            status = await proc.wait()
        except asyncio.CancelledError:
            await _kill(proc)
            raise
        if status == SSH_FAILURE:
            raise self.classify_failure(cluster, err.decode(errors="replace"))
        return status

    async def sync(self, cluster: str, source: Path, destination: str, *, timeout: float = 600) -> None:
        """Copy a local file or directory to the cluster over the cluster's ControlMaster.

        `destination` is relative to the remote home (or absolute); a directory's contents are copied
        into it. rsync when both sides have it (only changes travel), else a tar stream, which every
        site has.
        """
        if not source.exists():
            raise CorralFileError(f"{source}: no such file or directory to sync to {cluster}")
        if shutil.which("rsync") and cluster not in self._no_remote_rsync:
            if await self._rsync(cluster, source, destination, timeout):
                return
            self._no_remote_rsync.add(cluster)
        await self._tar(cluster, source, destination, timeout)

    async def _rsync(self, cluster: str, source: Path, destination: str, timeout: float) -> bool:
        """False if the cluster has no rsync; raises on any other failure."""
        ssh = " ".join(shlex.quote(a) for a in self.ssh_argv(cluster, [])[:-2])
        src = f"{source}/" if source.is_dir() else str(source)
        argv = ["rsync", "-a", "--mkpath", "-e", ssh, f"--rsync-path={self.remote_rsync}", src,
                f"{cluster}:{destination}"]
        text, status = await self._transfer(cluster, argv, None, source, timeout)
        if status == 0:
            return True
        if "command not found" in text or ("No such file or directory" in text and "rsync" in text):
            return False
        if status == 255 or "connection unexpectedly closed" in text:
            raise self.classify_failure(cluster, text)
        raise RemoteCommandError(cluster, f"copying {source} failed: {_last_line(text)}", exit_status=status,
                                 stderr=text)

    async def _tar(self, cluster: str, source: Path, destination: str, timeout: float) -> None:
        dest = destination.rstrip("/") or "."
        target = shlex.quote(dest) if dest.startswith("/") else f'"$HOME"/{shlex.quote(dest)}'
        if source.is_dir():
            remote = f"mkdir -p {target} && tar -xf - -C {target}"
            local = ["tar", "-cf", "-", "-C", str(source), "."]
        else:
            remote = f'mkdir -p "$(dirname {target})" && cat > {target}'
            local = ["cat", str(source)]
        packer = await asyncio.create_subprocess_exec(*local, stdout=asyncio.subprocess.PIPE)
        assert packer.stdout is not None
        data = await packer.stdout.read()
        if await packer.wait() != 0:
            raise CorralFileError(f"{source}: could not be read for copying to {cluster}")
        text, status = await self._transfer(cluster, self.ssh_argv(cluster, [remote]), data, source, timeout)
        if status == 255:
            raise self.classify_failure(cluster, text)
        if status != 0:
            raise RemoteCommandError(cluster, f"copying {source} failed: {_last_line(text)}", exit_status=status,
                                     stderr=text)

    async def fetch(self, cluster: str, remote_dir: str, local_dir: Path, *, timeout: float = 600) -> bool:
        """Copy a remote directory's contents into `local_dir` (a tar stream). False if it does not exist."""
        path = remote_dir.rstrip("/")
        target = shlex.quote(path) if path.startswith("/") else f'"$HOME"/{shlex.quote(path)}'
        script = f"[ -d {target} ] || exit 3\ntar -cf - -C {target} .\n"
        argv = self.ssh_argv(cluster, ["bash", "-c", shlex.quote(script)])
        self.round_trips[cluster] += 1
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            data, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            await _kill(proc)
            raise SshTimeoutError(cluster, f"fetching {remote_dir} took longer than {timeout:g}s") from None
        if proc.returncode == 3:
            return False
        if proc.returncode == 255:
            raise self.classify_failure(cluster, err.decode(errors="replace"))
        if proc.returncode != 0:
            raise RemoteCommandError(cluster, f"fetching {remote_dir} failed: {_last_line(err.decode())}",
                                     exit_status=proc.returncode)
        local_dir.mkdir(parents=True, exist_ok=True)
        unpack = await asyncio.create_subprocess_exec("tar", "-xf", "-", "-C", str(local_dir),
                                                      stdin=asyncio.subprocess.PIPE)
        await unpack.communicate(data)
        if unpack.returncode != 0:
            raise CorralFileError(f"could not unpack {remote_dir} from {cluster} into {local_dir}")
        return True

    async def _transfer(self, cluster: str, argv: list[str], stdin: bytes | None, source: Path,
                        timeout: float) -> tuple[str, int]:
        self.round_trips[cluster] += 1
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            _out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        except asyncio.TimeoutError:
            await _kill(proc)
            raise SshTimeoutError(cluster, f"copying {source} took longer than {timeout:g}s") from None
        return err.decode(errors="replace"), proc.returncode if proc.returncode is not None else -1

    async def close(self, cluster: str) -> None:
        """Stop the cluster's ControlMaster, if any (the next call opens a new one)."""
        argv = self.ssh_argv(cluster, [])
        argv[argv.index("--"):argv.index("--")] = ["-O", "exit"]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        await proc.wait()


CorralErrorLike = ClusterError | ConfigError


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


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
