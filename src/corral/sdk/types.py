"""The SDK's typed results: plain dataclasses built from the API's JSON (no pydantic on the client).

Each has `from_json` (what the server sent) and `raw` (the same dict, for `--json` output that must stay
byte-compatible with what the CLI printed before the server existed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ClusterCheck:
    cluster: str
    ok: bool
    error: str | None
    error_kind: str | None
    slurm_version: str | None
    partitions: list[str]
    default_partition: str | None
    gpu_types: list[str]
    nodes: int
    seconds: float
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterCheck:
        return cls(data["cluster"], bool(data["ok"]), data.get("error"), data.get("error_kind"),
                   data.get("slurm_version"), list(data.get("partitions") or []), data.get("default_partition"),
                   list(data.get("gpu_types") or []), int(data.get("nodes") or 0), float(data.get("seconds") or 0),
                   data)


@dataclass(frozen=True)
class GpuRow:
    cluster: str
    partition: str
    gpu: str
    gres_type: str | None
    free: int
    total: int
    nodes: int
    pending: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuRow:
        return cls(data["cluster"], data["partition"], data["gpu"], data.get("gres_type"), int(data["free"]),
                   int(data["total"]), int(data["nodes"]), int(data.get("pending") or 0), data)


@dataclass(frozen=True)
class Unreachable:
    cluster: str
    error_message: str
    error_kind: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Unreachable:
        return cls(data["cluster"], data["error"], data.get("error_kind"), data)


@dataclass(frozen=True)
class GpuReport:
    rows: list[GpuRow]
    failures: list[Unreachable]


@dataclass(frozen=True)
class Job:
    """One job as the queue shows it: its latest attempt's place and state."""

    job_id: str
    name: str
    state: str
    cluster: str | None
    partition: str | None
    slurm_job_id: str | None
    reason: str | None
    attempt: int
    submitted_at: float | None
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    sweep_id: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(data["job_id"], data["name"], data["state"], data.get("cluster"), data.get("partition"),
                   data.get("slurm_job_id"), data.get("reason"), int(data.get("attempt") or 0),
                   data.get("submitted_at"), data.get("started_at"), data.get("ended_at"), data.get("exit_code"),
                   data.get("sweep_id"), data)

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


ENDED_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "SUBMIT_FAILED", "LOST"})


@dataclass(frozen=True)
class QueuePage:
    jobs: list[Job]
    more: int  # ended jobs (or sweeps, when grouped) beyond this page
    sweeps: dict[str, dict[str, int]]  # per sweep on the page: its jobs per state, all of them
    warnings: list[str]  # clusters that could not be refreshed


@dataclass(frozen=True)
class CancelOutcome:
    job_id: str
    cancelled: bool
    state: str  # the state it had when it was not cancelled (already ended)
