"""Locks for what must happen once at a time.

- File locks (flock), on this machine: creating a store's schema, starting the controller. A lock is
  released when its holder exits, however it exits, so a crash never leaves one behind. Cost: one open
  and flock.
- Store locks (`in_store`), across every process and server replica on one store: what one user does
  to one dev allocation (create, reuse, take down). A lease row in the store, renewed while held;
  a holder that dies frees it once the lease lapses. Cost: one statement to take (polled every 0.1 s
  while another holds it), one per renewal (every 10 s), one to give up.
"""

from __future__ import annotations

import fcntl
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from corral.config import corral_home, private_file

if TYPE_CHECKING:
    from corral.state import Store

STORE_LOCK = "lock:"  # the leases that are store locks
STORE_LOCK_SECONDS = 30.0  # a dead holder's store lock lapses this long after its last renewal
STORE_LOCK_POLL = 0.1  # seconds between tries for a store lock another holds


@contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (made mode 600 if missing), waiting for it if needed."""
    with open(private_file(path), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def named(kind: str, name: str) -> Path:
    """The lock file for one named thing under Corral's home, e.g. ("dev", "my-alloc")."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return corral_home() / "locks" / f"{kind}-{safe}.lock"


@asynccontextmanager
async def in_store(store: Store, kind: str, name: str, ttl: float = STORE_LOCK_SECONDS) -> AsyncIterator[None]:
    """Hold the store lock for one named thing (e.g. ("dev", "ada/box")) for the block, waiting while
    another holds it, whether in this process, another one or another replica on the store."""
    import asyncio  # here: the thin CLI imports this module (file locks), never asyncio

    from corral.infra.base import new_token
    from corral.liveness import process_tag
    from corral.periodic import repeating

    lease = f"{STORE_LOCK}{kind}:{name}"
    holder = f"{process_tag()}:{new_token()}"  # one per holding: two requests in one process take turns too
    while not store.acquire_lease(lease, holder, ttl):
        await asyncio.sleep(STORE_LOCK_POLL)

    try:
        async with repeating(ttl / 3, lambda: store.acquire_lease(lease, holder, ttl)):
            yield
    finally:
        store.release_lease(lease, holder)
