"""One error tree for everything Corral reports to a user.

Every error renders as one line that says what is wrong, where, and what to do (`str(err)`).
"""

from __future__ import annotations

from pathlib import Path


class CorralError(Exception):
    """Root of every error Corral raises on purpose. The CLI prints it as one line and exits 1."""

    exit_code = 1


class ConfigError(CorralError):
    """The cluster file or user config is missing or malformed."""

    def __init__(self, message: str, path: Path | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line


class UnknownClusterError(CorralError):
    def __init__(self, name: str, known: list[str]):
        listed = ", ".join(known) if known else "none configured"
        super().__init__(f"unknown cluster {name!r}; known clusters: {listed}")
        self.name = name
        self.known = known


class InvalidInfraError(CorralError):
    """An --infra value that is not slurm, slurm/<cluster> or slurm/<cluster>/<partition>."""


class ClusterError(CorralError):
    """Something went wrong talking to one cluster. The message always names the cluster."""

    reason = "error"

    def __init__(self, cluster: str, detail: str):
        super().__init__(f"{cluster}: {detail}")
        self.cluster = cluster
        self.detail = detail


class ClusterUnreachableError(ClusterError):
    """The login node could not be reached (refused, no route, name does not resolve)."""

    reason = "unreachable"


class SshAuthError(ClusterError):
    reason = "auth"


class HostKeyError(ClusterError):
    reason = "host-key"


class SshTimeoutError(ClusterError):
    reason = "timeout"


class RemoteCommandError(ClusterError):
    """The remote command ran and failed; carries its exit status and stderr."""

    reason = "remote-command"

    def __init__(self, cluster: str, detail: str, exit_status: int | None = None, stderr: str = ""):
        super().__init__(cluster, detail)
        self.exit_status = exit_status
        self.stderr = stderr


class SlurmControllerError(ClusterError):
    """The login node answered but its Slurm controller did not."""

    reason = "controller"


class ProbeParseError(ClusterError):
    """The cluster answered with output Corral cannot read (an unsupported Slurm version?)."""

    reason = "parse"
