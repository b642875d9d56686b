"""One error tree for everything Corral reports to a user.

Every error renders as one line that says what is wrong, where, and what to do (`str(err)`), or as a
line and the list it introduces (`listed`: each place's reason where no place can run a task), and its
class says how the `corral` command exits (codes from BSD's sysexits, as docs/cli.md lists them), so a
script tells Corral's own failures (64-78) apart from a job's (an attached launch or an exec exits with
the job's code; 1 is what Corral says for "the job failed" when the job gave no code of its own).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

EXIT_USAGE = 2  # a bad flag or argument (click's own code, as argparse's)
EXIT_DATAERR = 65  # the task or a value given is invalid
EXIT_NOINPUT = 66  # a named job, allocation, cluster or upload does not exist
EXIT_UNAVAILABLE = 69  # a cluster, the server or every candidate place is unavailable
EXIT_SOFTWARE = 70  # a bug in Corral
EXIT_TEMPFAIL = 75  # `logs --status`: the job has not ended yet; ask again later
EXIT_NOPERM = 77  # authentication refused (ssh keys, host keys, the server's token)
EXIT_CONFIG = 78  # the cluster file or user settings are broken


class CorralError(Exception):
    """Root of every error Corral raises on purpose. The CLI prints it as one line and exits with
    `exit_code` (1 for what fits no narrower class)."""

    exit_code = 1


class InternalError(CorralError):
    """A bug in Corral, told to a client as such where an answer has already begun (a stream); the
    traceback goes to the server's log."""

    exit_code = EXIT_SOFTWARE


class ConfigError(CorralError):
    """The cluster file or user config is missing or malformed."""

    exit_code = EXIT_CONFIG

    def __init__(self, message: str, path: Path | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line


class TaskError(CorralError):
    """A task file or a command-line override that cannot be used; names the file and field."""

    exit_code = EXIT_DATAERR


class NotFoundError(CorralError):
    """A named job, allocation, cluster or upload that does not exist."""

    exit_code = EXIT_NOINPUT


class UnknownClusterError(NotFoundError):
    def __init__(self, name: str, known: list[str]):
        listed = ", ".join(known) if known else "none configured"
        super().__init__(f"unknown cluster {name!r}; known clusters: {listed}")
        self.name = name
        self.known = known


class UnknownPartitionError(NotFoundError):
    def __init__(self, cluster: str, partition: str, known: list[str]):
        super().__init__(f"{cluster}: no partition {partition!r}; partitions: {', '.join(known)}")


class InvalidInfraError(CorralError):
    """An --infra value of none of the forms infra/selector.py reads (slurm/<cluster>, k8s/<context>, …)."""

    exit_code = EXIT_DATAERR


class ForbiddenError(CorralError):
    """The user may not do this (a team server's isolation, or an admin-only operation)."""

    exit_code = EXIT_NOPERM


class NoAccountError(ForbiddenError):
    """A team server's user has no account it may use on a cluster (no mapping, or no way to act as them)."""

    def __init__(self, cluster: str, message: str):
        super().__init__(message)
        self.cluster = cluster


class UnavailableError(CorralError):
    """Nothing that could do the work answers or accepts it now (clusters, the server)."""

    exit_code = EXIT_UNAVAILABLE


class ClusterError(UnavailableError):
    """Something went wrong talking to one cluster. The message always names the cluster."""

    reason = "error"

    def __init__(self, cluster: str, detail: str):
        super().__init__(f"{cluster}: {detail}")
        self.cluster = cluster
        self.detail = detail


# How a message sets out a list, each item on an indented line of its own: the one line break the CLI
# prints as such (`printed`); any other in a message is a value's, and printed escaped.
LIST_BREAK = "\n  "


def printable(text: str) -> str:
    """`text` with every line break and other control character escaped (`\\n`, `\\x1b`): a value from a
    user, a cluster or a file, safe to print on a terminal as part of one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def listed(head: str, items: Iterable[str]) -> str:
    """`head`, then each item on an indented line of its own (each item printable)."""
    return head + "".join(LIST_BREAK + printable(item) for item in items)


def printed(message: str) -> str:
    """An error message as the CLI prints it: a list's lines as lines (`listed`), any other control
    character escaped, so that no value in it can start a line of its own or move the cursor."""
    return LIST_BREAK.join(printable(part) for part in message.split(LIST_BREAK))


def asked_again(failure: str, waited: float) -> str:
    """A cluster's last failure, while it is being asked again and has not answered in `waited` seconds
    (the tracker's status queries, the client's probes)."""
    return f"{failure} (asked again: no answer in {waited:g} s yet)"


class ClusterUnreachableError(ClusterError):
    """The login node could not be reached (refused, no route, name does not resolve)."""

    reason = "unreachable"


class SshAuthError(ClusterError):
    reason = "auth"
    exit_code = EXIT_NOPERM


class HostKeyError(ClusterError):
    reason = "host-key"
    exit_code = EXIT_NOPERM


class SshTimeoutError(ClusterError):
    reason = "timeout"


class ClusterBusyError(ClusterError):
    """Corral holds back: the cluster's command budget is spent, or its controller said it is busy."""

    reason = "busy"


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


# How an output stream (a job's log, over HTTP) says that the server could not read on: its last line,
# on a line of its own, after everything read before. HTTP has no way left to say it once the body has
# begun. The error's class and exit status close the line, so that a job whose own last line reads
# `corral: error: …` is not taken for it.
STREAM_ERROR = b"corral: error: "
_STREAM_ERROR_END = re.compile(rb" \(([A-Za-z]\w{0,63}), exit ([0-9]{1,3})\)\n\Z")


def stream_error_line(exc: CorralError) -> bytes:
    """`exc` as an output stream's last line (read back by read_stream_error)."""
    message = " ".join(str(exc).split())
    return STREAM_ERROR + f"{message} ({type(exc).__name__}, exit {exc.exit_code})\n".encode()


def read_stream_error(line: bytes) -> tuple[str, str, int] | None:
    """(message, error class, exit status) of an output stream's last line written by stream_error_line;
    None for any other line."""
    end = _STREAM_ERROR_END.search(line)
    if not line.startswith(STREAM_ERROR) or end is None or b"\n" in line[:end.start()]:
        return None
    message = line[len(STREAM_ERROR):end.start()].decode("utf-8", errors="replace")
    return message, end.group(1).decode(), int(end.group(2))
