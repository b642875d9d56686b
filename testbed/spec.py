"""What the local testbed's clusters look like.

The clusters differ the way real sites do: partition names, GPU types and counts, and GRES type
spellings that are not the marketing name (``nvidia_h100_80gb_hbm3`` on one site, ``H100`` on another,
an untyped ``gpu`` on a third), plus a CPU-only partition and an empty one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

TEST_USER = "corral-test"
# A team's members, each their own Unix account on every cluster (a team server submits as them).
TEAM_USERS = ("corral-alice", "corral-bob")
ALL_USERS = (TEST_USER, *TEAM_USERS)
TEAM_GROUP = "corral-team"  # the members, whom the test user may act as through sudo (docs/sudoers.example)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    port: int
    sockets: int = 1
    cores_per_socket: int = 8
    memory_mb: int = 64000
    gpu_type: str | None = None  # None with gpus > 0 means untyped GRES (gpu:N)
    gpus: int = 0
    gpu_cores: str | None = None  # gres.conf Cores=, which sinfo shows as (S:0-1)
    features: str | None = None  # node features, for --constraint

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def gres(self) -> str | None:
        if not self.gpus:
            return None
        if self.gpu_type is None:
            return f"gpu:{self.gpus}"
        return f"gpu:{self.gpu_type}:{self.gpus}"


@dataclass(frozen=True)
class PartitionSpec:
    name: str
    nodes: tuple[str, ...]
    default: bool = False
    max_time: str = "INFINITE"
    # Real sites give jobs a time limit; without one Slurm cannot predict start times.
    default_time: str = "01:00:00"


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    ctld_port: int
    ssh_port: int
    nodes: tuple[NodeSpec, ...]
    partitions: tuple[PartitionSpec, ...]
    accounting: bool = False  # run slurmdbd + MariaDB, so `sacct` works on this cluster
    dbd_port: int | None = None
    db_port: int | None = None
    extra_conf: tuple[str, ...] = field(default_factory=tuple)
    # Versions of the stand-in `cuda` environment module this site offers (a module tree of its own).
    cuda_modules: tuple[str, ...] = ("12.4",)
    # Container runtimes this site offers, as stand-ins on its login and compute PATH (see layout.py).
    container_runtimes: tuple[str, ...] = ()

    @property
    def ctld_host(self) -> str:
        return f"{self.name}-ctl"

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({n.gpu_type for n in self.nodes if n.gpus and n.gpu_type}))

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


def default_clusters() -> tuple[ClusterSpec, ...]:
    alpine = ClusterSpec(
        name="alpine",
        ctld_port=47017,
        ssh_port=47022,
        nodes=(
            NodeSpec("a1", 47031, gpu_type="nvidia_h100_80gb_hbm3", gpus=4),
            NodeSpec("a2", 47032, gpu_type="nvidia_h100_80gb_hbm3", gpus=4),
            NodeSpec("a3", 47033, cores_per_socket=16),
            NodeSpec("a4", 47034, gpu_type="nvidia_l4", gpus=2),
        ),
        partitions=(
            PartitionSpec("gpu", ("a1", "a2"), default=True),
            PartitionSpec("cpu", ("a3",)),
            PartitionSpec("inference", ("a4",)),
        ),
        cuda_modules=("12.1", "12.2"),
    )
    borealis = ClusterSpec(
        name="borealis",
        ctld_port=47117,
        ssh_port=47122,
        accounting=True,
        dbd_port=47119,
        db_port=47106,
        nodes=(
            NodeSpec("b1", 47131, sockets=2, gpu_type="H100", gpus=8, gpu_cores="0-15", features="ib"),
            NodeSpec("b2", 47132, sockets=2, gpu_type="H100", gpus=8, gpu_cores="0-15", features="ib"),
            NodeSpec("b3", 47133, gpu_type="l40s", gpus=4),
        ),
        partitions=(
            PartitionSpec("h100-cluster", ("b1", "b2"), default=True, max_time="2-00:00:00"),
            PartitionSpec("l40s", ("b3",)),
        ),
    )
    cirrus = ClusterSpec(
        name="cirrus",
        ctld_port=47217,
        ssh_port=47222,
        nodes=(
            NodeSpec("c1", 47231, gpu_type="b300", gpus=8),
            NodeSpec("c2", 47232, gpu_type="b300", gpus=8),
            NodeSpec("c3", 47233, gpus=2),
        ),
        partitions=(
            PartitionSpec("b300", ("c1", "c2"), default=True),
            PartitionSpec("debug", ("c3",), max_time="01:00:00", default_time="00:30:00"),
            PartitionSpec("maint", ()),
        ),
        cuda_modules=("12.2",),
        container_runtimes=("apptainer",),
    )
    return (alpine, borealis, cirrus)


def testbed_root() -> Path:
    return Path(os.environ.get("CORRAL_TESTBED_DIR", "/var/lib/corral-testbed"))


# The scale mode's clusters take 20 ports each from here: the controller, the login sshd, two slurmd.
SCALE_PORT_BASE = 48000
MAX_SCALE_CLUSTERS = 50
# Sites spell GPU types their own way; the scale clusters rotate through the spellings Corral maps.
SCALE_GPU_TYPES = ("nvidia_h100_80gb_hbm3", "H100", "nvidia_a100_80gb_pcie", "l40s", "b300")


def scale_clusters(count: int) -> tuple[ClusterSpec, ...]:
    """`count` (1-50) small clusters s01, s02, …: each a controller, one GPU node (4 GPUs of a rotating
    type, in partition `gpu`), one CPU node (partition `cpu`) and its own login sshd. Kept cheap: no
    accounting, small nodes; the binaries, users and client key are shared with every cluster."""
    if not 1 <= count <= MAX_SCALE_CLUSTERS:
        raise ValueError(f"the scale mode runs 1 to {MAX_SCALE_CLUSTERS} clusters, not {count}")
    clusters = []
    for index in range(count):
        base = SCALE_PORT_BASE + 20 * index
        name = f"s{index + 1:02d}"
        gpu_node, cpu_node = f"{name}g1", f"{name}c1"
        clusters.append(ClusterSpec(
            name=name,
            ctld_port=base,
            ssh_port=base + 2,
            nodes=(NodeSpec(gpu_node, base + 3, cores_per_socket=8, gpus=4,
                            gpu_type=SCALE_GPU_TYPES[index % len(SCALE_GPU_TYPES)]),
                   NodeSpec(cpu_node, base + 4, cores_per_socket=4, memory_mb=16000)),
            partitions=(PartitionSpec("gpu", (gpu_node,), default=True), PartitionSpec("cpu", (cpu_node,))),
        ))
    return tuple(clusters)
