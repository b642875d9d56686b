"""A login node's login-shell environment, learned once and replayed, so that each round trip need not
run the site's profile again.

Corral runs its scripts in the environment a login shell has (`bash --login`): sites put Slurm on
PATH, set SLURM_CONF and define `module` in /etc/profile.d, and `sbatch` hands that environment to
the job. A login shell costs its profile every time: 28 ms a round trip on the testbed, where
environment modules' init runs `ps` and sources its scripts; Lmod on a real site often costs more.
So the first call to a login node (per acting account) also writes the login shell's environment to
stderr, between markers (`CAPTURE`); later calls run `bash --noprofile --norc` with that environment
exported first (`replay`), variables and exported functions alike, for `LOGIN_ENV_SECONDS` (600;
0: a login shell every time). What a session sets for itself (SSH_*, the Kerberos ticket cache,
PWD, ...) is never replayed. A call that finds a command missing (exit 127) forgets the environment,
so the next call learns it again. Pure functions and a small per-process cache; no I/O.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from corral.config import env_number

MARK = "@@corral-login-env@@"
# Written at the top of a script run by `bash --login -s`: the environment, NUL-separated, on stderr.
CAPTURE = f"{{ printf '%s\\0' '{MARK}'; env -0; printf '%s\\n' '{MARK}'; }} >&2\n"

# What each session sets for itself, or what bash owns: replaying an old session's value would be wrong.
SESSION_VARIABLES = frozenset({
    "_", "PWD", "OLDPWD", "SHLVL", "SHELLOPTS", "BASHOPTS", "BASH_ENV", "ENV", "UID", "EUID", "PPID",
    "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "SSH_ORIGINAL_COMMAND", "DISPLAY",
    "KRB5CCNAME", "XDG_SESSION_ID", "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "TERM",
})
SESSION_PREFIXES = ("SUDO_",)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FUNCTION = re.compile(r"BASH_FUNC_(?P<name>[A-Za-z_][A-Za-z0-9_-]*)%%")


SECONDS_ENV = "CORRAL_LOGIN_ENV_SECONDS"


def login_env_seconds() -> float:
    """How long a learned environment is used (CORRAL_LOGIN_ENV_SECONDS, default 600; 0: a login shell
    every call)."""
    return env_number(SECONDS_ENV, 600.0, note="; 0 runs the login profile on every call")


def split_capture(stderr: str) -> tuple[str | None, str]:
    """The captured environment's text (None if the script never wrote it) and stderr without it."""
    start = stderr.find(MARK + "\0")
    if start < 0:
        return None, stderr
    end = stderr.find(MARK + "\n", start + len(MARK) + 1)
    if end < 0:
        return None, stderr
    return stderr[start + len(MARK) + 1:end], stderr[:start] + stderr[end + len(MARK) + 1:]


def replay(captured: str) -> str | None:
    """Shell lines that export the captured environment (`env -0` text): each variable shell-quoted,
    each exported function as bash wrote it (the site's own text, which its login shell runs anyway).
    None when the text holds no PATH (an `env` without `-0`, say): then the login shell stays."""
    entries = captured.split("\0")
    if not any(entry.startswith("PATH=") for entry in entries):
        return None
    lines = []
    for entry in entries:
        name, sep, value = entry.partition("=")
        if not sep or "\ufffd" in entry:  # not an assignment, or bytes that did not decode
            continue
        function = _FUNCTION.fullmatch(name)
        if function and value.startswith("() {"):
            lines.append(f"{function['name']} {value}\nexport -f {function['name']}")
        elif _NAME.fullmatch(name) and name not in SESSION_VARIABLES and not name.startswith(SESSION_PREFIXES):
            lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n" if lines else ""


@dataclass(frozen=True)
class LoginEnv:
    script: str  # what `replay` made of it
    learned_at: float
    # What callers learned about the login node meanwhile, gone with this environment (relearned,
    # forgotten or expired): the Slurm probe keeps the node's version, filesystems and runtimes here.
    notes: dict[str, Any] = field(default_factory=dict)


class LoginEnvs:
    """Learned environments by (ssh config, cluster, acting account), shared by every transport of the
    process (the server makes one per request)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, ...], LoginEnv] = {}

    def get(self, key: tuple[str, ...], now: float | None = None) -> LoginEnv | None:
        known = self._known.get(key)
        seconds = login_env_seconds()
        if known is None or seconds <= 0 or (now if now is not None else time.monotonic()) - known.learned_at > seconds:
            return None
        return known

    def learn(self, key: tuple[str, ...], captured: str, now: float | None = None) -> None:
        script = replay(captured)
        if script is not None:
            self._known[key] = LoginEnv(script, now if now is not None else time.monotonic())

    def forget(self, key: tuple[str, ...]) -> None:
        self._known.pop(key, None)


LOGIN_ENVS = LoginEnvs()
