"""SlurmInfra: one Slurm cluster behind its login node."""

from __future__ import annotations

from corral.infra.base import ClusterSnapshot
from corral.infra.slurm.probe import parse_probe_output, probe_script
from corral.ssh import SshTransport

DEFAULT_SLURM_TIMEOUT = 5


class SlurmInfra:
    def __init__(self, cluster: str, transport: SshTransport, *, slurm_timeout: int = DEFAULT_SLURM_TIMEOUT):
        self.cluster = cluster
        self.transport = transport
        self.slurm_timeout = slurm_timeout

    @property
    def name(self) -> str:
        return f"slurm/{self.cluster}"

    async def probe(self) -> ClusterSnapshot:
        # The SSH budget covers a new connection plus the Slurm commands' own limit.
        budget = self.transport.connect_timeout + self.slurm_timeout + 3
        result = await self.transport.run(self.cluster, probe_script(self.slurm_timeout), timeout=budget)
        return parse_probe_output(self.cluster, result.stdout, self.slurm_timeout, result.seconds)
