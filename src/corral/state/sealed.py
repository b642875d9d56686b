"""Secret env values at rest: sealed (Fernet: AES-128-CBC with an HMAC-SHA256) before they reach the
state store, so a copy of the database, a backup or a PostgreSQL dump holds no secret in clear.

The key is `CORRAL_SECRETS_KEY` (a team server's, from its own secret store) or, for one user, a
key file made on first use at `~/.corral/keys/secrets.key`, mode 600. Cost: microseconds per job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from corral.config import corral_home, private_dir
from corral.errors import CorralError

KEY_ENV = "CORRAL_SECRETS_KEY"


class SealError(CorralError):
    """Sealed values that cannot be opened with this key (another machine's store, or a new key)."""


def key_file() -> Path:
    return corral_home() / "keys" / "secrets.key"


def _key() -> bytes:
    from cryptography.fernet import Fernet

    given = os.environ.get(KEY_ENV)
    if given:
        return given.encode()
    path = key_file()
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    private_dir(path.parent)
    key = Fernet.generate_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as f:
        f.write(key + b"\n")
    return key


def seal(values: dict[str, str]) -> str | None:
    """The values, encrypted for the store; None when there are none."""
    if not values:
        return None
    from cryptography.fernet import Fernet

    return Fernet(_key()).encrypt(json.dumps(values).encode()).decode()


def unseal(sealed: str | None) -> dict[str, str]:
    if not sealed:
        return {}
    from cryptography.fernet import Fernet, InvalidToken

    try:
        return json.loads(Fernet(_key()).decrypt(sealed.encode()))
    except (InvalidToken, ValueError) as exc:
        where = KEY_ENV if os.environ.get(KEY_ENV) else str(key_file())
        raise SealError(f"this job's secrets cannot be read with the key in {where}; launch it again with "
                        "its --secret values") from exc
