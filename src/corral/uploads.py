"""The files clients send with a task (`PUT /v1/uploads/{sha256}`), kept by content under CORRAL_HOME.

Uploads are kept per user: one user's launch never uses files another user sent, even by naming
their digest. An upload is a tar archive (layout: `corral.sdk.files`) unpacked into
`uploads/<sha256>/` (`uploads/<sha256>-<user key>/` for a team server's users): a folder as
`tree/`, a file as `file/<name>`. Unpacking refuses absolute names, `..`, links that leave the folder
and device files (tarfile's "data" filter). Launches then name the uploads, and the task's workdir and
file_mounts become these server-side paths, from which the infra syncs to the cluster.

Cost: one streamed write and one unpack per new content; the same content sent again is found at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from corral.config import corral_home, env_number, private_dir
from corral.errors import NotFoundError, TaskError
from corral.limits import send_limit
from corral.taskfile import source_scheme

DIGEST = re.compile(r"^[0-9a-f]{64}\Z")
ORIGIN_FILE = "origin"  # where the client read it (host:path), for the cluster-side cache's key


class UploadError(TaskError):
    """An upload the server refuses: wrong digest, too large, or an archive it will not unpack."""


class UploadNotFoundError(NotFoundError):
    """A launch names files the server does not hold (send them first)."""


def uploads_dir() -> Path:
    return private_dir(corral_home() / "uploads")


def _folder(digest: str, owner: str) -> str:
    if not DIGEST.match(digest):
        raise UploadError(f"{digest!r} is not a SHA-256 digest (64 lowercase hex digits)")
    return f"{digest}-{hashlib.sha256(owner.encode()).hexdigest()[:16]}" if owner else digest


def upload_path(digest: str, owner: str = "") -> Path | None:
    """The unpacked upload `owner` sent, or None if the server does not hold it."""
    path = uploads_dir() / _folder(digest, owner)
    return path if path.is_dir() else None


async def receive(digest: str, body: AsyncIterator[bytes], owner: str = "", declared: int | None = None) -> Path:
    """Store an upload from a request body; idempotent (a digest already held is kept as it is).
    `declared`: its Content-Length, refused before anything is read when over the limit."""
    import asyncio

    found = upload_path(digest, owner)
    if found is not None:
        os.utime(found)  # sent again: in use, not to be pruned
        return found
    limit = send_limit()
    if declared is not None and declared > limit:
        raise _too_large(limit)
    root = uploads_dir()
    fd, name = tempfile.mkstemp(prefix=".incoming-", dir=root)
    archive = Path(name)
    try:
        sha, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as f:
            async for chunk in body:
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                sha.update(chunk)
                f.write(chunk)
        if sha.hexdigest() != digest:
            raise UploadError(f"upload's content does not match its digest {digest[:12]}… (sent incompletely?)")
        return await asyncio.to_thread(_unpack, archive, root / _folder(digest, owner))
    finally:
        archive.unlink(missing_ok=True)


def _too_large(limit: int) -> UploadError:
    return UploadError(f"upload larger than {limit:,} bytes (CORRAL_MAX_UPLOAD_BYTES): keep datasets on the "
                       "cluster and mount them by path")


def _unpack(archive: Path, final: Path) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=final.parent))
    try:
        try:
            with tarfile.open(archive, "r:") as tar:
                members = tar.getmembers()
                tops = {m.name.split("/", 1)[0] for m in members}
                if not members or not tops <= {"tree", "file"} or len(tops) != 1:
                    raise UploadError("an upload holds one folder as tree/ or one file as file/<name>")
                tar.extractall(staging, filter="data")
        except tarfile.FilterError as exc:
            raise UploadError(f"upload refused: {exc}") from None
        except (tarfile.TarError, EOFError) as exc:
            raise UploadError(f"upload is not a readable tar archive: {exc}") from None
        try:
            staging.rename(final)
        except OSError:
            if not final.is_dir():  # a concurrent upload of the same content won: keep its copy
                raise
        return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def resolve(digest: str, what: str, owner: str = "") -> Path:
    """The server-side path of an upload for a task field (`what`), a folder or the one file in it."""
    found = upload_path(digest, owner)
    if found is None:
        raise UploadNotFoundError(f"{what}: the server does not hold upload {digest[:12]}…; send it first "
                                  "(PUT /v1/uploads/{sha256})")
    os.utime(found)  # used by a launch now
    if (found / "tree").is_dir():
        return found / "tree"
    [single] = list((found / "file").iterdir())
    return single


def with_uploads(task: Any, files: dict[str, Any], owner: str = "") -> Any:
    """The task with its workdir and file_mounts sources replaced by the uploads `owner` sent for
    them (`{"workdir": sha256, "file_mounts": {remote: sha256}, "workdir_origin": "host:/path"}`)."""
    update: dict[str, Any] = {}
    mounts = files.get("file_mounts") or {}
    if task.workdir:
        if not files.get("workdir"):
            raise TaskError(f"workdir {task.workdir!r}: its files were not sent with the task (a client must "
                            "upload them: corral.sdk does)")
        update["workdir"] = str(resolve(files["workdir"], "workdir", owner))
        origin = files.get("workdir_origin")
        if isinstance(origin, str) and origin:  # one cluster-side cache per user and origin
            (Path(update["workdir"]).parent / ORIGIN_FILE).write_text(json.dumps(f"{owner}@{origin}" if owner
                                                                                 else origin))
    if task.file_mounts:
        # Object storage (s3://…) is not sent by the client: the server fetches it (buckets.py).
        local = [remote for remote, source in task.file_mounts.items() if source_scheme(source) is None]
        missing = [remote for remote in local if not mounts.get(remote)]
        if missing:
            raise TaskError(f"file_mounts {', '.join(map(repr, missing))}: their files were not sent with the task")
        update["file_mounts"] = {remote: str(resolve(mounts[remote], f"file_mounts[{remote!r}]", owner))
                                 if remote in local else source for remote, source in task.file_mounts.items()}
    return task.model_copy(update=update) if update else task


KEEP_DAYS_ENV = "CORRAL_UPLOAD_KEEP_DAYS"


def keep_days_setting() -> float:
    return env_number(KEEP_DAYS_ENV, 7.0, unit="days")


def prune(live_tasks: list[str], *, now: float | None = None, keep_days: float | None = None) -> list[str]:
    """Remove uploads last sent more than `keep_days` ago (CORRAL_UPLOAD_KEEP_DAYS, default 7) that no
    live managed job's task names (a recovery would sync them again), and unpacking leftovers older
    than a day. `live_tasks`: the task JSON of every live managed job. Returns the digests removed."""
    import time

    now = time.time() if now is None else now
    keep = keep_days_setting() if keep_days is None else keep_days
    root = uploads_dir()
    named: set[str] = set()
    for text in live_tasks:
        try:
            task = json.loads(text)
        except ValueError:
            continue
        paths = [task.get("workdir")] + list((task.get("file_mounts") or {}).values())
        named |= {Path(p).relative_to(root).parts[0] for p in paths
                  if isinstance(p, str) and Path(p).is_relative_to(root)}
    removed = []
    for entry in root.iterdir():
        age = now - entry.stat().st_mtime
        if entry.name.startswith("."):
            if age > 86400:  # an upload interrupted while it was written or unpacked
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            continue
        if age > keep * 86400 and entry.name not in named:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def cache_key(workdir: str) -> str:
    """The cluster-side cache a workdir syncs into: one per origin (machine and folder) when the client
    said where it read it, else one per content."""
    path = Path(workdir)
    try:
        key = json.loads((path.parent / ORIGIN_FILE).read_text())
    except (OSError, ValueError):
        key = str(path)
    return hashlib.sha256(str(key).encode()).hexdigest()[:16]
