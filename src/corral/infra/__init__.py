"""Backends behind one seam (`base.Infra`). `connect` is the only way in from outside `corral/infra/`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.infra.base import Infra
    from corral.ssh import SshTransport


def connect(cluster: str, transport: SshTransport) -> Infra:
    """The Infra for a cluster of the registry (every cluster there is a Slurm login node today)."""
    from corral.infra.slurm import SlurmInfra

    return SlurmInfra(cluster, transport)
