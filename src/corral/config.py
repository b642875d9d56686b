"""The cluster registry: the `Host` entries of ~/.slurm/config, and where Corral keeps its files.

The file is OpenSSH client syntax and is handed to `ssh -F` as is, so every ssh option works
(ProxyJump, IdentityFile, Port, User, ...). Corral itself only reads which Host names it defines: each
concrete Host name is a cluster; patterns (`*`, `?`, `!`) only carry options for the others.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

from corral.errors import ConfigError, UnknownClusterError

CLUSTER_FILE_ENV = "CORRAL_SLURM_CONFIG"
HOME_ENV = "CORRAL_HOME"
_KEYWORD = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+)(.*?)\s*$")
_MAX_INCLUDE_DEPTH = 8


def corral_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".corral")


def cluster_file_path() -> Path:
    return Path(os.environ.get(CLUSTER_FILE_ENV) or Path.home() / ".slurm" / "config")


@dataclass(frozen=True)
class ClusterEntry:
    """One cluster: a concrete `Host` name in the cluster file."""

    name: str
    path: Path
    line: int
    hostname: str | None  # the HostName given in its own block, if any

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class ClusterRegistry:
    path: Path
    entries: tuple[ClusterEntry, ...]

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def get(self, name: str) -> ClusterEntry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise UnknownClusterError(name, self.names())

    def select(self, names: list[str] | tuple[str, ...] | None) -> list[ClusterEntry]:
        """The named clusters, in the order given (default: all, in file order)."""
        if not names:
            return list(self.entries)
        return [self.get(n) for n in dict.fromkeys(names)]


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?!")


def _parse(path: Path, entries: list[ClusterEntry], depth: int) -> None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError("cluster file not found", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read cluster file: {exc}", path) from None
    current: list[int] = []  # indexes into entries of the Host block being read
    for lineno, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _KEYWORD.match(raw)
        if not match or not match.group(2):
            raise ConfigError(
                f"malformed line {stripped!r}: expected `Keyword value` (OpenSSH config syntax)",
                path, lineno,
            )
        keyword, value = match.group(1).lower(), match.group(2)
        if keyword == "host":
            current = []
            for name in value.split():
                if _is_pattern(name):
                    continue
                if any(e.name == name for e in entries):
                    continue  # as in OpenSSH, the first block for a name defines it
                current.append(len(entries))
                entries.append(ClusterEntry(name=name, path=path, line=lineno, hostname=None))
        elif keyword == "match":
            current = []
        elif keyword == "hostname":
            for i in current:
                e = entries[i]
                entries[i] = ClusterEntry(e.name, e.path, e.line, value.split()[0])
        elif keyword == "include":
            if depth >= _MAX_INCLUDE_DEPTH:
                raise ConfigError("Include nested too deeply", path, lineno)
            for pattern in value.split():
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = str(Path.home() / ".ssh" / pattern)
                for included in sorted(glob.glob(pattern)):
                    _parse(Path(included), entries, depth + 1)


def load_registry(path: Path | None = None) -> ClusterRegistry:
    """Read the cluster file. Raises ConfigError naming the file (and line) on bad input."""
    path = path or cluster_file_path()
    if not path.exists():
        raise ConfigError(
            "cluster file not found: create it with one `Host <cluster>` entry per login node "
            f"(OpenSSH syntax), or point {CLUSTER_FILE_ENV} at one",
            path,
        )
    entries: list[ClusterEntry] = []
    _parse(path, entries, 0)
    if not entries:
        raise ConfigError("no clusters defined: add a `Host <cluster>` entry per login node", path)
    return ClusterRegistry(path=path, entries=tuple(entries))


USER_SETTINGS_KEYS = {"idle_minutes": (int, float)}


def load_user_settings() -> dict[str, object]:
    """`~/.corral/config.yaml` (under CORRAL_HOME): defaults such as `idle_minutes: 60`."""
    path = corral_home() / "config.yaml"
    if not path.exists():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", path) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping of settings, e.g. `idle_minutes: 60`", path)
    for key, value in data.items():
        if key not in USER_SETTINGS_KEYS:
            raise ConfigError(f"unknown setting {key!r}; known: {', '.join(USER_SETTINGS_KEYS)}", path)
        if not isinstance(value, USER_SETTINGS_KEYS[key]) or isinstance(value, bool):
            raise ConfigError(f"setting {key!r} must be a number", path)
    return data
