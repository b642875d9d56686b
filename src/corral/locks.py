"""File locks (flock) for what must happen once at a time on this machine: creating a store's
schema, starting the controller, creating a dev allocation of a given name. A lock is released when
its holder exits, however it exits, so a crash never leaves one behind. Cost: one open and flock."""

from __future__ import annotations

import fcntl
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from corral.config import corral_home, private_file


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
