"""GPU use over time: the lease holder samples the pool (free, total and pending GPUs per cluster,
partition and type) every `CORRAL_USAGE_SAMPLE_SECONDS` (default 60) and keeps the samples for
`CORRAL_USAGE_RETENTION_DAYS` (default 14), for the dashboard's chart (`GET /v1/usage`).

Cost: one probe per cluster per sample (shared with any probe in flight), and rows in the store:
(clusters × partitions × GPU types) per sample, about 20,000 a day for a 14-row pool sampled per minute.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from corral.client import Client
from corral.config import env_number
from corral.state import Store

SAMPLE_ENV = "CORRAL_USAGE_SAMPLE_SECONDS"
RETENTION_ENV = "CORRAL_USAGE_RETENTION_DAYS"


@dataclass
class UsageSampler:
    interval: float = 60.0  # seconds between samples
    retention_days: float = 14.0
    last: float = 0.0  # time.monotonic() of the last sample

    @classmethod
    def from_env(cls) -> UsageSampler:
        """From the environment; the first sample is one interval after start (a server started for
        one command does not probe every cluster for it)."""
        return cls(env_number(SAMPLE_ENV, 60.0, minimum=1), env_number(RETENTION_ENV, 14.0, unit="days", minimum=0.01),
                   last=time.monotonic())

    def due(self, now: float) -> bool:
        return now - self.last >= self.interval

    async def sample(self, client: Client, store: Store) -> int:
        """Probe the pool and record it; returns the rows written (clusters that failed write none)."""
        self.last = time.monotonic()
        report = await client.gpus()
        at = time.time()
        rows = [{"at": at, "cluster": r.cluster, "partition": r.partition, "gpu": r.gpu, "free": r.free,
                 "total": r.total, "pending": r.pending} for r in report.rows]
        store.add_gpu_samples(rows, keep_after=at - self.retention_days * 86400)
        return len(rows)


def series(samples: list, since: float, until: float, points: int = 240) -> list[dict[str, object]]:
    """The samples as one series per (cluster, partition, GPU type), at most `points` points each: each
    point is a time bucket's busiest sample ([at, used, total, pending]), so a short peak still shows."""
    width = max(1.0, (until - since) / points)
    buckets: dict[tuple[str, str, str], dict[int, list[float]]] = {}
    for row in samples:
        key = (row.cluster, row.partition, row.gpu)
        bucket = int((row.at - since) // width)
        point = [row.at, row.total - row.free, row.total, row.pending]
        kept = buckets.setdefault(key, {}).get(bucket)
        if kept is None or point[1] > kept[1]:
            buckets[key][bucket] = point
    return [{"cluster": c, "partition": p, "gpu": g, "points": [kept[b] for b in sorted(kept)]}
            for (c, p, g), kept in sorted(buckets.items())]
