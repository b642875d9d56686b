"""file_mounts from object storage (`s3://bucket/key` or a prefix), fetched where the job lands.

Compute nodes are often air-gapped, and a cluster's login node may have neither the client nor the
credentials. So the server fetches the objects, once per version, into its upload store, and from
there they reach the cluster as any local file mount does (rsync over the cluster's SSH connection).
The data streams through the control plane; nothing is installed on the cluster.

Stores: S3 and any S3-compatible one (MinIO, Ceph, R2 through its S3 endpoint, …) through boto3, which
reads the usual AWS_* settings on the server (AWS_ENDPOINT_URL for another store). `gs://`, `r2://`,
`cos://` and the others SkyPilot knows are refused with a clear error: the client Corral uses speaks S3.

Cost: one HEAD or LIST per mount (its size and ETags, also what `--dryrun` reports), then the objects
downloaded once per version (a version is the bucket, the prefix and every object's ETag), streamed to disk, bounded
by CORRAL_MAX_UPLOAD_BYTES like an upload.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from corral.errors import TaskError
from corral.limits import send_limit
from corral.taskfile import source_scheme
from corral.uploads import uploads_dir

SUPPORTED = ("s3",)
# Schemes SkyPilot accepts that this client cannot read: refused by name.
KNOWN = ("gs", "gcs", "r2", "cos", "oci", "az", "azure", "ibm", "nebius")
MAX_OBJECTS = 100_000


class BucketError(TaskError):
    """An object-storage mount that cannot be read: its URI, why, what to do."""


scheme = source_scheme  # a file mount's URI scheme (`s3`), or None for a local path


def check_source(source: str) -> None:
    """Refuse (ValueError, for the task's validation) a bucket this server cannot read."""
    kind = scheme(source)
    if kind is None or kind in SUPPORTED:
        return
    known = " (SkyPilot's; not through this client)" if kind in KNOWN else ""
    raise ValueError(f"{source}: {kind}:// object storage{known} is not supported; Corral fetches s3:// and "
                     "S3-compatible stores (set AWS_ENDPOINT_URL on the server for one that is not AWS)")


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    etag: str


@dataclass(frozen=True)
class Listing:
    """What a mount's URI names: one object, or every object under a prefix."""

    uri: str
    bucket: str
    prefix: str
    objects: tuple[StoredObject, ...]
    single: bool

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    def version(self) -> str:
        """A name for this content: the bucket, the prefix (so `a/b` and `a/b/` are one) and every
        object's key and ETag."""
        data = json.dumps([self.bucket, self.prefix, self.single, [(o.key, o.etag) for o in self.objects]]).encode()
        return hashlib.sha256(data).hexdigest()


def _split(uri: str) -> tuple[str, str]:
    rest = uri.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise BucketError(f"{uri}: no bucket named (expected s3://BUCKET[/KEY or PREFIX])")
    return bucket, key


def _client() -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:  # pragma: no cover - a dependency of the server
        raise BucketError("s3:// file_mounts need boto3 on the server (pip install boto3)") from None
    return boto3.client("s3", config=Config(retries={"max_attempts": 3, "mode": "standard"}))


def _explain(uri: str, exc: Exception) -> BucketError:
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return BucketError(f"{uri}: the server has no credentials for S3 (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                           "a profile, or an instance role, as boto3 reads them)")
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchBucket", "404", "NotFound"):
            return BucketError(f"{uri}: no such bucket or object")
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return BucketError(f"{uri}: access denied to the server's credentials ({code})")
        return BucketError(f"{uri}: the store answered {code or exc}")
    if isinstance(exc, BotoCoreError):
        return BucketError(f"{uri}: cannot reach the store: {exc}")
    return BucketError(f"{uri}: {exc}")


def list_source(uri: str) -> Listing:
    """The object the URI names, or the objects under it as a prefix (a "folder"); BucketError if none."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = _split(uri)
    client = _client()
    try:
        if key and not key.endswith("/"):
            try:
                head = client.head_object(Bucket=bucket, Key=key)
                return Listing(uri, bucket, key, (StoredObject(key, int(head["ContentLength"]),
                                                               str(head.get("ETag", ""))),), True)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                    raise
        prefix = f"{key}/" if key and not key.endswith("/") else key
        objects: list[StoredObject] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                if not item["Key"].endswith("/"):
                    objects.append(StoredObject(item["Key"], int(item["Size"]), str(item.get("ETag", ""))))
            if len(objects) > MAX_OBJECTS:
                raise BucketError(f"{uri}: more than {MAX_OBJECTS:,} objects; mount a narrower prefix")
    except (BotoCoreError, ClientError) as exc:
        raise _explain(uri, exc) from None
    if not objects:
        raise BucketError(f"{uri}: no such object, and no objects under it")
    return Listing(uri, bucket, prefix, tuple(objects), False)


def fetch(uri: str, owner: str = "") -> Path:
    """The mount's content on the server (a file, or a folder as the prefix's tree), downloaded unless
    this version is held already; the folder is the owner's, like their uploads."""
    from botocore.exceptions import BotoCoreError, ClientError

    listing = list_source(uri)
    if listing.size > (limit := send_limit()):
        raise BucketError(f"{uri}: {listing.size:,} bytes, more than the server's CORRAL_MAX_UPLOAD_BYTES "
                          f"({limit:,})")
    owner_key = hashlib.sha256(owner.encode()).hexdigest()[:16] if owner else "server"
    final = uploads_dir() / f"bucket-{listing.version()[:32]}-{owner_key}"
    if not final.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=".fetching-", dir=uploads_dir()))
        try:
            client = _client()
            for item in listing.objects:
                relative = PurePosixPath(item.key).name if listing.single else item.key[len(listing.prefix):]
                target = staging / ("file" if listing.single else "tree") / _safe(relative, uri)
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as out:
                    client.download_fileobj(listing.bucket, item.key, out)
            try:
                staging.rename(final)
            except OSError:
                if not final.is_dir():
                    raise
        except (BotoCoreError, ClientError) as exc:
            raise _explain(uri, exc) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    os.utime(final)  # used now: kept by the upload store's pruning as long as an upload would be
    if listing.single:
        [single] = list((final / "file").iterdir())
        return single
    return final / "tree"


def _safe(relative: str, uri: str) -> str:
    """An object's path below the mount point: no absolute names, no `..` (a key may hold anything)."""
    parts = [p for p in PurePosixPath(relative).parts if p not in ("", ".")]
    if not parts or ".." in parts or relative.startswith("/"):
        raise BucketError(f"{uri}: object key {relative!r} would land outside the mount point")
    return str(PurePosixPath(*parts))


def bucket_mounts(task: Any) -> dict[str, str]:
    """The task's file_mounts whose source is object storage: remote path -> URI."""
    return {remote: source for remote, source in task.file_mounts.items() if scheme(source)}


async def fetched(task: Any, owner: str, on_step: Any = None) -> Any:
    """The task with each object-storage mount replaced by its content on the server (downloaded in a
    thread: the server's loop keeps serving). `on_step(detail)` hears about each fetch."""
    import asyncio

    mounts = bucket_mounts(task)
    if not mounts:
        return task
    local = dict(task.file_mounts)
    for remote, uri in mounts.items():
        if on_step:
            on_step(f"fetching {uri} for {remote}")
        try:
            local[remote] = str(await asyncio.to_thread(fetch, uri, owner))
        except BucketError as exc:
            raise BucketError(f"file_mounts[{remote!r}]: {exc}") from None
    return task.model_copy(update={"file_mounts": local})


def transfer_bytes(task: Any) -> int:
    """What the task's files weigh: its workdir and file_mounts as the server holds them, and objects
    not fetched yet as the store lists them. At most what a cluster is sent (rsync sends only changes)."""
    return sum(source_size(path) for path in [task.workdir, *task.file_mounts.values()] if path)


def source_size(path: str) -> int:
    """A workdir's or mount's bytes: a local file or folder as it is, an object-storage URI as listed."""
    if scheme(path):
        return list_source(path).size
    found = Path(path)
    if found.is_file():
        return found.stat().st_size
    return sum(f.stat().st_size for f in found.rglob("*") if f.is_file() and not f.is_symlink())
