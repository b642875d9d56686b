"""SlurmInfra: one Slurm cluster behind its login node."""

from __future__ import annotations

import math

from corral.infra.base import ClusterSnapshot
from corral.infra.slurm.probe import parse_probe_output, probe_script
from corral.ssh import SshTransport

# What the login node keeps for itself out of the transport's timeout: connecting and answering.
_SSH_MARGIN = 3


class SlurmInfra:
    def __init__(self, cluster: str, transport: SshTransport):
        self.cluster = cluster
        self.transport = transport
        # Slurm's commands get what is left of the one timeout once ssh has had its share.
        self.slurm_timeout = max(1, math.floor(transport.timeout) - _SSH_MARGIN)

    @property
    def name(self) -> str:
        return f"slurm/{self.cluster}"

    async def probe(self) -> ClusterSnapshot:
        # One bound for the whole answer, a new connection included.
        result = await self.transport.run(self.cluster, probe_script(self.slurm_timeout),
                                          timeout=self.transport.timeout)
        return parse_probe_output(self.cluster, result.stdout, self.slurm_timeout, result.seconds)
