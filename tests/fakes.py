"""An in-memory backend behind the Infra seam: launch, placement, failover, the tracker and the
controller's rules run on it without Slurm. Capacity comes from recorded real probe output."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from corral.client import LeftOut, ProbeOutcome
from corral.errors import ClusterUnreachableError
from corral.infra.base import (
    AttemptFiles,
    ClusterSnapshot,
    FailureClass,
    HostsJobGroups,
    Infra,
    JobRequest,
    JobState,
    JobStatus,
    OutputSink,
    ReleasesHeld,
    RunsArrays,
    SubmitResult,
)
from corral.profiles import Profiles


class FakeInfra(Infra, ReleasesHeld, HostsJobGroups):
    """Accepts or refuses by place; keeps every job it accepted, by handle, with its token. With
    `lose_kills`, a cancel is acknowledged but the job goes on (a kill lost while Slurm launches it).
    With `groups_refused`, it cannot run a job group's tasks, saying that."""

    kind: ClassVar[str] = "fake"

    def __init__(self, cluster: str, snapshot: ClusterSnapshot, *, refuse: set[str] | None = None,
                 unreachable: bool = False):
        self.cluster = cluster
        self.snapshot = snapshot
        self.refuse = refuse or set()
        self.unreachable = unreachable
        self.requests: list[JobRequest] = []
        self.jobs: dict[str, JobStatus] = {}
        self.cancelled: list[str] = []
        self.released: list[str] = []
        self.lose_kills = False
        self.groups_refused: str | None = None
        self.removed_groups: list[str] = []
        self.uploads: list[tuple[Path, str]] = []
        self._ids = itertools.count(100)

    @property
    def name(self) -> str:
        return f"fake/{self.cluster}"

    def job_group_refusal(self) -> str | None:
        return self.groups_refused

    async def remove_group_files(self, group_ids: list[str]) -> None:
        self._check()
        self.removed_groups += group_ids

    def _check(self) -> None:
        if self.unreachable:
            raise ClusterUnreachableError(self.cluster, "login node refused the connection (fake)")

    async def probe(self, *, associations: bool = False, paths: tuple[str, ...] = (),
                    filesystems: tuple[str, ...] = ()) -> ClusterSnapshot:
        self._check()
        return self.snapshot

    def attempt_files(self, request: JobRequest) -> AttemptFiles:
        return AttemptFiles(f"runs/{request.token}", tuple(f"runs/{request.token}/log-{i}"
                                                           for i in range(len(request.task_ids))))

    async def upload(self, local: Path, remote: str, token: str | None = None) -> None:
        self._check()
        self.uploads.append((local, remote))

    async def submit(self, request: JobRequest) -> SubmitResult:
        self._check()
        self.requests.append(request)
        if request.place in self.refuse:
            return SubmitResult(False, None, False, f"fake refuses {request.place}")
        handle = str(next(self._ids))
        copies = range(len(request.task_ids)) if request.is_array else [None]
        for index in copies:
            token = request.token if index is None else f"{request.token}"
            job_handle = handle if index is None else self.array_handle(handle, index)  # type: ignore[attr-defined]
            self.jobs[job_handle] = status(job_handle, token, JobState.PENDING)
        return SubmitResult(True, handle, False, "")

    async def status(self, handles: list[str], accounts: Sequence[str] = (), *, others: bool = True
                     ) -> list[JobStatus]:
        self._check()
        return list(self.jobs.values())

    async def cancel(self, handles: list[str], run_dirs: list[str]) -> None:
        self._check()
        self.cancelled += handles
        for handle in handles if not self.lose_kills else []:
            if handle in self.jobs:
                self.jobs[handle] = status(handle, self.jobs[handle].token, JobState.CANCELLED)

    async def release_held(self, handles: list[str]) -> None:
        self._check()
        self.released += handles

    async def logs(self, handle: str, log_path: str, follow: bool, on_output: OutputSink, tail: int = 0) -> None:
        on_output(f"log of {handle}\n".encode())

    def finish(self, handle: str, state: JobState, failure: FailureClass | None = None, native: str = "",
               ended_at: float | None = None) -> None:
        ended = status(handle, self.jobs[handle].token, state, failure, native or state.value)
        self.jobs[handle] = dataclasses.replace(ended, ended_at=ended_at)


class FakeArrayInfra(FakeInfra, RunsArrays):
    max_array_size: ClassVar[int] = 3

    @staticmethod
    def array_handle(handle: str, index: int) -> str:
        return f"{handle}.{index}"

    @staticmethod
    def array_index(handle: str) -> int | None:
        index = handle.partition(".")[2]
        return int(index) if index else None


def status(handle: str, token: str | None, state: JobState, failure: FailureClass | None = None,
           native: str | None = None) -> JobStatus:
    return JobStatus(handle=handle, token=token, state=state, native_state=native or state.value, reason=None,
                     submitted_at=1.0, started_at=None, ended_at=None, exit_code=None, failure=failure)


@dataclass
class FakeRegistry:
    order: list[str]
    path: Path = Path("/dev/null")

    def names(self) -> list[str]:
        return list(self.order)

    def get(self, name: str) -> str:
        if name not in self.order:
            from corral.errors import UnknownClusterError

            raise UnknownClusterError(name, self.order)
        return name

    def infra_kind(self, name: str) -> str:
        return "slurm"

    def names_of(self, *kinds: str) -> list[str]:
        return self.names() if "slurm" in kinds else []


@dataclass
class FakeTransport:
    round_trips: dict[str, int] = field(default_factory=dict)


class FakeClient:
    """What Launcher, Tracker and the controller use of `corral.client.Client`."""

    def __init__(self, infras: dict[str, FakeInfra]):
        self.infras = infras
        self.registry = FakeRegistry(list(infras))
        self.transport = FakeTransport()
        self.profiles = Profiles()

    def infra(self, cluster: str, owner: str = "") -> FakeInfra:
        self.registry.get(cluster)
        return self.infras[cluster]

    def refusal(self, owner: str, cluster: str) -> str | None:
        return None

    def cluster_users(self, cluster: str) -> list[str]:
        return []

    async def probe(self, clusters: list[str] | None = None, *, associations: bool = False,
                    paths: tuple[str, ...] = (), filesystems: dict[str, tuple[str, ...]] | None = None,
                    reuse_when_busy: bool = False, leave_out: dict[str, str] | None = None) -> list[ProbeOutcome]:
        out = []
        leave_out = leave_out or {}
        for name in clusters or self.registry.names():
            infra = self.infras[name]
            if name in leave_out:
                out.append(ProbeOutcome(name, None, LeftOut(name, leave_out[name]), 0.0))
            elif infra.unreachable:
                out.append(ProbeOutcome(name, None, ClusterUnreachableError(name, "refused (fake)"), 0.0))
            else:
                out.append(ProbeOutcome(name, await infra.probe(), None, 0.0))
        return out
