"""`--infra` values: `slurm`, `slurm/<cluster>`, `slurm/<cluster>/<partition>`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from corral.errors import InvalidInfraError

SUPPORTED_KINDS = ("slurm",)
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+\-]{0,255}\Z", re.ASCII)


@dataclass(frozen=True)
class InfraSelector:
    kind: str = "slurm"
    cluster: str | None = None
    partition: str | None = None

    def __str__(self) -> str:
        return "/".join(p for p in (self.kind, self.cluster, self.partition) if p)


def parse_infra(text: str) -> InfraSelector:
    parts = text.strip().strip("/").split("/")
    if not parts[0] or len(parts) > 3 or any(not p for p in parts):
        raise InvalidInfraError(
            f"invalid infra {text!r}: expected slurm, slurm/<cluster> or slurm/<cluster>/<partition>"
        )
    for part in parts[1:]:
        if not _NAME.match(part):
            raise InvalidInfraError(f"invalid infra {text!r}: {part!r} is not a cluster or partition name "
                                    "(letters, digits, '_', '.', '-', '@', '+')")
    kind = parts[0].lower()
    if kind not in SUPPORTED_KINDS:
        raise InvalidInfraError(
            f"infra kind {parts[0]!r} is not supported (yet); supported: {', '.join(SUPPORTED_KINDS)}"
        )
    return InfraSelector(kind, *parts[1:])
