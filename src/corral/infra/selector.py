"""`--infra` values: `slurm`, `slurm/<cluster>`, `slurm/<cluster>/<partition>`, `ssh`, `ssh/<pool>`, `k8s`,
`k8s/<context>` (`kubernetes` is SkyPilot's other spelling of k8s); and in task files, other kinds
SkyPilot knows (aws, gcp/us-central1, …), which Corral skips."""

from __future__ import annotations

import re
from dataclasses import dataclass

from corral.errors import InvalidInfraError

SUPPORTED_KINDS = ("slurm", "ssh", "k8s")
ALIASES = {"kubernetes": "k8s"}
MAX_PARTS = {"slurm": 3, "ssh": 2, "k8s": 2, "kubernetes": 2}  # a pool or a context is one place
EXPECTED = "slurm, slurm/<cluster>, slurm/<cluster>/<partition>, ssh, ssh/<pool>, k8s or k8s/<context>"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+\-]{0,255}\Z", re.ASCII)


@dataclass(frozen=True)
class InfraSelector:
    kind: str = ""  # "": any kind
    cluster: str | None = None
    partition: str | None = None

    def __str__(self) -> str:
        return "/".join(p for p in (self.kind, self.cluster, self.partition) if p)


def parse_infra(text: str) -> InfraSelector:
    parts = text.strip().strip("/").split("/")
    if not parts[0] or len(parts) > MAX_PARTS.get(parts[0].lower(), 3) or any(not p for p in parts):
        raise InvalidInfraError(f"invalid infra {text!r}: expected {EXPECTED}")
    for part in parts[1:]:
        if not _NAME.match(part):
            raise InvalidInfraError(f"invalid infra {text!r}: {part!r} is not a cluster or partition name "
                                    "(letters, digits, '_', '.', '-', '@', '+')")
    kind = ALIASES.get(parts[0].lower(), parts[0].lower())
    if kind not in SUPPORTED_KINDS:
        raise InvalidInfraError(
            f"infra kind {parts[0]!r} is not supported (yet); supported: {', '.join(SUPPORTED_KINDS)}"
        )
    return InfraSelector(kind, *parts[1:])


_KIND = re.compile(r"^[A-Za-z][A-Za-z0-9\-]{0,31}\Z", re.ASCII)


def parse_any_infra(text: str) -> InfraSelector:
    """An infra as a task file may name it: a kind Corral runs (checked as `parse_infra` does), or
    another kind, kept as written after the kind (`aws/us-east-1`: kind aws, the rest as `cluster`)."""
    kind, _, rest = text.strip().strip("/").partition("/")
    if _KIND.match(kind) and ALIASES.get(kind.lower(), kind.lower()) not in SUPPORTED_KINDS:
        if any(ord(c) < 32 or ord(c) == 127 for c in rest) or len(rest) > 512:
            raise InvalidInfraError(f"invalid infra {text!r}: one line of at most 512 characters after the kind")
        return InfraSelector(kind.lower(), rest or None)
    return parse_infra(text)


def supported(selector: InfraSelector) -> bool:
    return not selector.kind or selector.kind in SUPPORTED_KINDS
