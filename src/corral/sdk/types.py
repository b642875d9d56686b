"""The SDK's typed results: plain dataclasses built from the API's JSON (no pydantic on the client).

Each has `from_json` (what the server sent) and `raw` (the same dict, for `--json` output that must stay
byte-compatible with what the CLI printed before the server existed).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, TypeVar


class JobStatus(enum.StrEnum):
    """A job's state as the server reports it (SkyPilot's `sky.JobStatus`). A member equals its name
    as a string, so `job.state == "FAILED"` works too."""

    SUBMITTING = "SUBMITTING"  # recorded, not yet accepted by the cluster
    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELLED = "CANCELLED"
    SUBMIT_FAILED = "SUBMIT_FAILED"
    LOST = "LOST"  # its cluster no longer knows it
    UNKNOWN = "UNKNOWN"

    @property
    def ended(self) -> bool:
        return self in ENDED_STATES


class ManagedJobStatus(enum.StrEnum):
    """A managed job's state across its attempts (SkyPilot's `sky.ManagedJobStatus`)."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"
    CANCELLED = "CANCELLED"

    @property
    def ended(self) -> bool:
        return self in MANAGED_ENDED_STATES


ENDED_STATES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.SUBMIT_FAILED,
                          JobStatus.LOST})
MANAGED_ENDED_STATES = frozenset({ManagedJobStatus.SUCCEEDED, ManagedJobStatus.FAILED,
                                  ManagedJobStatus.FAILED_SETUP, ManagedJobStatus.CANCELLED})


S = TypeVar("S", JobStatus, ManagedJobStatus)


def status_of(kind: type[S], text: str) -> S | str:
    """The member named `text`; a state this client does not know (a newer server's) stays its text,
    never ended."""
    try:
        return kind(text)
    except ValueError:
        return text


def handle_in(data: dict[str, Any]) -> Any:
    """An answer's handle: `handle`, or `slurm_job_id` from a server older than that name."""
    return data["handle"] if "handle" in data else data.get("slurm_job_id")


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
    warnings: list[str] = field(default_factory=list)  # what the cluster's profile names that it does not know

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterCheck:
        return cls(data["cluster"], bool(data["ok"]), data.get("error"), data.get("error_kind"),
                   data.get("slurm_version"), list(data.get("partitions") or []), data.get("default_partition"),
                   list(data.get("gpu_types") or []), int(data.get("nodes") or 0), float(data.get("seconds") or 0),
                   data, list(data.get("warnings") or []))


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
    max_per_node: int = 0  # the most of them one node has (what `gpus H100:8` filters on)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuRow:
        return cls(data["cluster"], data["partition"], data["gpu"], data.get("gres_type"), int(data["free"]),
                   int(data["total"]), int(data["nodes"]), int(data.get("pending") or 0), data,
                   int(data.get("max_per_node") or 0))


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
    as_of: float | None = None  # when the oldest of the clusters' answers came (epoch seconds)


@dataclass(frozen=True)
class Job:
    """One job as the queue shows it: its latest attempt's place and state."""

    job_id: str
    name: str
    state: JobStatus | str  # the text only for a state this client does not know
    cluster: str | None
    partition: str | None
    handle: str | None  # where it runs: a Slurm job id, a pool's lab1/<token>, a context's Job name
    reason: str | None
    attempt: int
    submitted_at: float | None
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    sweep_id: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    allocation: str | None = None  # the dev allocation it ran in (`corral exec`), if any
    number: int | None = None  # its number in that allocation (1 first), when asked about the allocation
    stderr_path: str | None = None  # on its cluster: its script's --error file, apart from the output

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(data["job_id"], data["name"], status_of(JobStatus, data["state"]), data.get("cluster"),
                   data.get("partition"), handle_in(data), data.get("reason"), int(data.get("attempt") or 0),
                   data.get("submitted_at"), data.get("started_at"), data.get("ended_at"), data.get("exit_code"),
                   data.get("sweep_id"), data, data.get("allocation"), data.get("number"), data.get("stderr_path"))

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    @property
    def slurm_job_id(self) -> str | None:
        """`handle`, by its older name (a Slurm job id only on a Slurm cluster)."""
        return self.handle


@dataclass(frozen=True)
class QueuePage:
    jobs: list[Job]
    more: int  # ended jobs (or sweeps, when grouped) beyond this page
    sweeps: dict[str, dict[str, int]]  # per sweep on the page: its jobs per state, all of them
    warnings: list[str]  # clusters that could not be refreshed
    # per sweep on the page: [its first job's start, its last job's end once none is live, its first
    # submission] (epoch seconds)
    sweep_times: dict[str, list[float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class CancelOutcome:
    job_id: str
    cancelled: bool
    state: JobStatus | ManagedJobStatus | str  # the state it had when it was not cancelled (already ended)
    # When the job was named by its id and is the first of a sweep of several (the id the sweep's queue
    # row shows): the sweep's name and its number of jobs. Only this job was cancelled; the name
    # cancels them all.
    sweep_name: str | None = None
    sweep_jobs: int = 0


@dataclass(frozen=True)
class PlanRow:
    """One place a task could run, as a launch's plan ranks it (best first; `chosen` is where it goes)."""

    cluster: str
    partition: str | None
    infra: str
    feasible: bool
    reason: str
    free_gpus: int
    can_start_now: bool
    predicted_start: float | None
    chosen: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanRow:
        return cls(data["cluster"], data.get("partition"), str(data.get("infra") or ""), bool(data["feasible"]),
                   str(data.get("reason") or ""), int(data.get("free_gpus") or 0), bool(data.get("can_start_now")),
                   data.get("predicted_start"), bool(data.get("chosen")), data)


@dataclass(frozen=True)
class Submission:
    """One share of a launch: one job, or one job array holding several jobs of a sweep."""

    job_ids: list[str]
    cluster: str
    partition: str
    handle: str  # where it runs (a Slurm job id, the array's for a share of a sweep; a pool's lab1/<token>)
    handles: list[str]  # one per job (its array task's id in a share)
    skipped: list[tuple[str, str]]  # (infra, why) tried first
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Submission:
        return cls(list(data["job_ids"]), data["cluster"], data["partition"], str(handle_in(data)),
                   list(data.get("handles") or []), [(s["infra"], s["reason"]) for s in data.get("skipped") or []],
                   data)

    @property
    def slurm_job_id(self) -> str:
        """`handle`, by its older name (a Slurm job id only on a Slurm cluster)."""
        return self.handle


@dataclass(frozen=True)
class Launched:
    """What a launch submitted: per task given, its shares; with `detach=False`, each job's end too."""

    tasks: list[list[Submission]]
    ended: list[Job] = field(default_factory=list)

    @property
    def submissions(self) -> list[Submission]:
        return [share for shares in self.tasks for share in shares]

    @property
    def job_ids(self) -> list[str]:
        return [job_id for share in self.submissions for job_id in share.job_ids]

    @property
    def job_id(self) -> str:
        return self.job_ids[0]


@dataclass(frozen=True)
class PipelinePlace:
    """Where a managed job stands in a pipeline: the pipeline's id (its first task's job id), its name,
    and the task's place (0, 1, …); the task starts once the one before it has succeeded. In a job
    group (`parallel`), the tasks run side by side, and an `auxiliary` one is stopped once the
    group's primary tasks have ended."""

    id: str
    name: str
    task: int
    parallel: bool = False
    auxiliary: bool = False


@dataclass(frozen=True)
class ManagedJob:
    """A managed job: its state (the controller's), latest attempt's place and its history counters;
    `pipeline` when it is one task of a pipeline."""

    job_id: str
    name: str
    state: ManagedJobStatus | str  # the text only for a state this client does not know
    reason: str | None
    cluster: str | None
    partition: str | None
    handle: str | None  # its latest attempt's (as Job.handle)
    attempts: int
    recoveries: int
    moves: int
    raw: dict[str, Any] = field(repr=False, compare=False)
    pipeline: PipelinePlace | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ManagedJob:
        place = data.get("pipeline")
        return cls(data["job_id"], data["name"], status_of(ManagedJobStatus, data["state"]), data.get("reason"),
                   data.get("cluster"), data.get("partition"), handle_in(data),
                   int(data.get("attempts") or 0), int(data.get("recoveries") or 0), int(data.get("moves") or 0), data,
                   PipelinePlace(place["id"], place["name"], int(place["task"]),
                                 place.get("execution") == "parallel", bool(place.get("auxiliary")))
                   if place else None)

    @property
    def ended(self) -> bool:
        return self.state in MANAGED_ENDED_STATES

    @property
    def slurm_job_id(self) -> str | None:
        """`handle`, by its older name (a Slurm job id only on a Slurm cluster)."""
        return self.handle
