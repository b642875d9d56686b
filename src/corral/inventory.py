"""GPU availability per (cluster, partition, GPU type), computed from probe snapshots.

`corral gpus` shows these rows; placement ranks candidates with the same numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from corral.gpu_names import gpu_matches, normalize_gpu_name
from corral.infra.base import ClusterSnapshot

UNTYPED_GPU = "gpu"
_COUNTED = re.compile(r"^[^:]+:[1-9][0-9]{0,3}\Z")  # H100:8


@dataclass(frozen=True)
class GpuAvailability:
    cluster: str
    partition: str
    gpu: str  # normalised model name, or "gpu" for untyped GRES
    gres_type: str | None  # the site's own GRES type; None for untyped `gpu:N`
    total: int
    free: int  # on nodes that are up, not drained, with a free CPU, in an UP partition
    nodes: int
    nodes_with_free: int
    max_free_per_node: int
    pending: int  # GPUs requested by pending jobs that may run in this partition
    max_per_node: int = 0  # the most of them one node has, free or not

    def to_json(self) -> dict[str, object]:
        return {
            "cluster": self.cluster,
            "partition": self.partition,
            "gpu": self.gpu,
            "gres_type": self.gres_type,
            "total": self.total,
            "free": self.free,
            "nodes": self.nodes,
            "nodes_with_free": self.nodes_with_free,
            "max_free_per_node": self.max_free_per_node,
            "max_per_node": self.max_per_node,
            "pending": self.pending,
        }


def gpu_availability(snapshot: ClusterSnapshot) -> list[GpuAvailability]:
    """One row per partition and GPU type, in the cluster's partition order."""
    rows = []
    for partition in snapshot.partitions:
        nodes = snapshot.nodes_in(partition.name)
        types = sorted({p.gres_type for n in nodes for p in n.gpus}, key=lambda t: (t is None, t or ""))
        for gres_type in types:
            with_type = [n for n in nodes if any(p.gres_type == gres_type for p in n.gpus)]
            free_per_node = [n.gpus_free(gres_type) if partition.up else 0 for n in with_type]
            rows.append(
                GpuAvailability(
                    cluster=snapshot.cluster,
                    partition=partition.name,
                    gpu=normalize_gpu_name(gres_type) if gres_type else UNTYPED_GPU,
                    gres_type=gres_type,
                    total=sum(p.total for n in with_type for p in n.gpus if p.gres_type == gres_type),
                    free=sum(free_per_node),
                    nodes=len(with_type),
                    nodes_with_free=sum(1 for f in free_per_node if f > 0),
                    max_free_per_node=max(free_per_node, default=0),
                    pending=_pending(snapshot, partition.name, gres_type, len(types)),
                    max_per_node=max((sum(p.total for p in n.gpus if p.gres_type == gres_type) for n in with_type),
                                     default=0),
                )
            )
    return rows


def _pending(snapshot: ClusterSnapshot, partition: str, gres_type: str | None, types_in_partition: int) -> int:
    """Typed requests count against their type; untyped ones against every type in the partition."""
    total = 0
    for demand in snapshot.pending:
        if partition not in demand.partitions:
            continue
        if demand.gres_type is None or demand.gres_type == gres_type or (
            gres_type is not None and gpu_matches(demand.gres_type, gres_type)
        ):
            total += demand.gpus
    return total


def filter_rows(rows: list[GpuAvailability], gpu: str | None) -> list[GpuAvailability]:
    """The rows of that GPU type; `H100:8` (as `sky show-gpus H100:8`): where one node has 8 of them."""
    if not gpu:
        return rows
    name, _, count = gpu.rpartition(":") if _COUNTED.match(gpu) else (gpu, "", "0")
    return [r for r in rows if gpu_matches(name, r.gres_type) and r.max_per_node >= int(count)]
