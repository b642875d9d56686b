"""The Infra interface and the snapshot a probe returns.

An Infra is one place that can run work (`slurm/<cluster>`). It stays narrow: what placement needs
to know (`probe`) now, and submit/status/cancel/logs as later issues add them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class GpuPool:
    """GPUs of one GRES type on one node. `gres_type` None is an untyped `gpu:N`."""

    gres_type: str | None
    total: int
    used: int


@dataclass(frozen=True)
class Node:
    name: str
    partitions: tuple[str, ...]
    state: str  # the scheduler's word for it, e.g. "idle", "mixed", "drained", "down*"
    usable: bool  # up and accepting new work
    cpus_total: int
    cpus_alloc: int
    memory_mb: int
    memory_alloc_mb: int
    gpus: tuple[GpuPool, ...] = ()
    reason: str | None = None

    @property
    def cpus_free(self) -> int:
        return self.cpus_total - self.cpus_alloc if self.usable else 0

    def gpus_free(self, gres_type: str | None) -> int:
        """GPUs of this type a new job could get now: none on an unusable or CPU-full node."""
        if not self.usable or self.cpus_free <= 0:
            return 0
        return sum(max(0, p.total - p.used) for p in self.gpus if p.gres_type == gres_type)


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    state: str  # UP, DOWN, DRAIN, INACTIVE
    max_time: str
    max_nodes: int | None
    total_nodes: int

    @property
    def up(self) -> bool:
        return self.state.upper() == "UP"


@dataclass(frozen=True)
class PendingDemand:
    """GPUs asked for by one pending job, in the partitions it may run in."""

    partitions: tuple[str, ...]
    gres_type: str | None
    gpus: int


@dataclass(frozen=True)
class ClusterSnapshot:
    """What one probe saw on one cluster."""

    cluster: str
    slurm_version: str | None
    nodes: tuple[Node, ...]
    partitions: tuple[Partition, ...]
    pending: tuple[PendingDemand, ...] = ()
    container_runtimes: tuple[str, ...] = ()  # enroot, apptainer, singularity found on the login node
    probe_seconds: float = 0.0
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def nodes_in(self, partition: str) -> list[Node]:
        return [n for n in self.nodes if partition in n.partitions]

    @property
    def gpu_types(self) -> list[str]:
        return sorted({p.gres_type for n in self.nodes for p in n.gpus if p.gres_type})


class Infra(Protocol):
    """One place that runs work."""

    @property
    def name(self) -> str:
        """`slurm/<cluster>`."""
        ...

    async def probe(self) -> ClusterSnapshot:
        """Everything placement needs, in one round trip. Raises ClusterError."""
        ...
