"""The local files a task names (`workdir`, `file_mounts` sources), read where the user runs the command
and packed for the server, which never reads the user's files itself. Standard library only, and
pathspec for a workdir with ignore rules (sdk/ignore.py).

A relative path is relative to the directory the command runs in (as in SkyPilot), `~` is the user's
home. A workdir leaves out what git would (its `.gitignore` files), or what `.corralignore` at its root
says instead (SkyPilot's `.skyignore`): sdk/ignore.py. file_mounts are sent whole.

Each path becomes one tar archive: a folder's contents under `tree/`, a file as `file/<its name>`. Its
SHA-256 names it, so sending the same content twice costs one request that finds it already there.
Cost: one walk of each path (which skips what is left out, and sums the sizes of what is sent) and one
tar of it, in a temporary file, never in memory. A path with more to send than the server's limit on
an upload is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.errors import TaskError
from corral.limits import send_limit
from corral.sdk.ignore import IGNORE_FILE, sent_entries  # noqa: F401 - IGNORE_FILE: re-exported


@dataclass(frozen=True)
class LocalFiles:
    """A task's local paths, absolute: its workdir and each file_mounts source by remote path."""

    workdir: Path | None = None
    mounts: dict[str, Path] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.workdir is not None or bool(self.mounts)


@dataclass(frozen=True)
class Packed:
    archive: Path  # a temporary tar file; the caller removes it
    digest: str  # sha256 of the archive, hex
    size: int


def task_files(data: Any, base: Path) -> LocalFiles:
    """The local paths of a parsed task (a mapping), checked to exist. Values of the wrong type are left
    for the server's validation, which names the field."""
    if not isinstance(data, dict):
        return LocalFiles()
    workdir = data.get("workdir")
    found: Path | None = None
    if isinstance(workdir, str) and workdir:
        found = absolute(workdir, base)
        if not found.is_dir():
            raise TaskError(f"workdir {workdir!r} is not a directory (relative to {base})")
        _not_around_packing(found, f"workdir {workdir!r}")
    mounts: dict[str, Path] = {}
    raw = data.get("file_mounts")
    if isinstance(raw, dict):
        for remote, value in raw.items():
            local = value.get("source") if isinstance(value, dict) else value  # SkyPilot's mapping form
            if isinstance(remote, str) and isinstance(local, str) and local and not is_bucket_uri(local):
                path = absolute(local, base)
                if not path.exists():
                    raise TaskError(f"file_mounts[{remote!r}]: local path {local!r} does not exist")
                _not_around_packing(path, f"file_mounts[{remote!r}]: local path {local!r}")
                mounts[remote] = path
    return LocalFiles(found, mounts)


def _not_around_packing(path: Path, what: str) -> None:
    """Refuse a folder that holds the temporary folder, where `pack` writes its archive and staging
    copy: packing it would read what it writes, without end, until the disk is full (`--workdir /`)."""
    scratch = Path(os.path.realpath(tempfile.gettempdir()))
    if path.is_dir() and scratch.is_relative_to(os.path.realpath(path)):
        raise TaskError(f"{what} holds this machine's temporary folder ({scratch}), where Corral packs what it "
                        "sends: give your project's own folder (and data as file_mounts or a bucket)")


def is_bucket_uri(source: str) -> bool:
    """An object store's URI (s3://, gs://, r2://, …): fetched where the job lands, not sent from here."""
    from corral.taskfile import source_scheme

    return source_scheme(source) is not None


def absolute(path: str, base: Path) -> Path:
    return Path(os.path.abspath(base / os.path.expanduser(path)))


def origin(path: Path) -> str:
    """Where a workdir comes from (this machine and path): the server keys its cluster-side cache by it,
    so relaunching from the same folder sends only what changed."""
    return f"{socket.gethostname()}:{path}"


def size_text(count: int) -> str:
    """A number of bytes for a person: `512 B`, `1.5 KiB`, … `12.0 GiB`."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{count} B"


def within_limit(path: Path, size: int, limit: int, whose: str = "") -> None:
    """Refuse `size` bytes to send over `limit`; `whose`: "the server's " when it is the server's limit."""
    if size > limit:
        raise TaskError(f"{path}: {size_text(size)} to send, more than {size_text(limit)} "
                        f"({whose}CORRAL_MAX_UPLOAD_BYTES): leave data out of a workdir with .corralignore or .gitignore, "
                        "and keep datasets on the cluster (file_mounts of a cluster path, or a bucket)")


def pack(path: Path, *, workdir: bool) -> Packed:
    """One path as a tar archive in a temporary file (see the module's docstring for the layout).
    Refused before anything is written when it holds more than `send_limit()` to send."""
    limit = send_limit()
    try:
        if path.is_dir():
            entries = list(sent_entries(path, rules=workdir))
            within_limit(path, sum(e.stat(follow_symlinks=False).st_size for e in entries
                                   if e.is_file(follow_symlinks=False)), limit)
        else:
            entries = []
            within_limit(path, path.stat().st_size, limit)
    except OSError as exc:
        raise TaskError(f"{path}: could not be read for sending: {exc.strerror or exc}") from None
    fd, name = tempfile.mkstemp(prefix="corral-upload-", suffix=".tar")
    os.close(fd)
    archive = Path(name)
    try:
        try:
            with tarfile.open(archive, "w") as tar:
                if path.is_dir():
                    tar.add(path, arcname="tree", recursive=False, filter=_content_only)
                    for entry in entries:
                        tar.add(entry.path, arcname=f"tree/{Path(entry.path).relative_to(path).as_posix()}",
                                recursive=False, filter=_content_only)
                else:
                    tar.add(path, arcname=f"file/{path.name}", filter=_content_only)
        except OSError as exc:
            raise TaskError(f"{path}: could not be read for sending: {exc.strerror or exc}") from None
        digest = hashlib.sha256()
        with open(archive, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return Packed(archive, digest.hexdigest(), archive.stat().st_size)
    except BaseException:
        archive.unlink(missing_ok=True)
        raise


def _content_only(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """What the digest should depend on: names, modes, contents and files' times (rsync's quick check
    uses them), not owners or folders' times (which change as files come and go)."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if info.isdir():
        info.mtime = 0
    return info


