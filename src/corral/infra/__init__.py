"""Backends behind one seam (`base.Infra`). `connect` is the only way in from outside `corral/infra/`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.infra.base import Infra
    from corral.ssh import SshTransport


def connect(cluster: str, transport: SshTransport) -> Infra:
    """The Infra for a place of the registry: a Slurm cluster's login node, an SSH pool, or a Kubernetes
    context."""
    registry = transport.registry
    kind = registry.infra_kind(cluster)
    if kind == "k8s":
        from corral.infra.kube.cluster import KubeInfra

        return KubeInfra(registry.kube_context(cluster), transport.round_trips, transport.timeout)
    if kind == "ssh":
        from corral.infra.sshpool.pool import SshPoolInfra

        return SshPoolInfra(registry.pool(cluster), transport)
    from corral.infra.slurm import SlurmInfra

    return SlurmInfra(cluster, transport)
