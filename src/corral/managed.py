"""Managed jobs, as users see them: launch (record), queue, cancel, events, why.

`corral jobs launch` only records the job and makes sure the controller runs; the controller places
and submits every attempt, the first one included, so there is one code path for first placement,
recovery and re-routing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.errors import TaskError
from corral.infra.base import JobState
from corral.jobgroup import auxiliary_delays
from corral.launch import check_num_jobs
from corral.state import Store
from corral.state.models import MANAGED_TERMINAL_STATES, AttemptRow, JobRow, ManagedJobRow, ManagedState
from corral.views import handle_fields, place_name
from corral.state.sealed import seal
from corral.task import MAX_NAME_LENGTH, Task, check_line, job_environment, redacted_json, resolved_secrets

MAX_PIPELINE_TASKS = 100


@dataclass(frozen=True)
class ManagedView:
    job: JobRow
    managed: ManagedJobRow
    attempts: list[AttemptRow]

    @property
    def latest(self) -> AttemptRow | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def ended_at(self) -> float | None:
        """When the job ended (its last attempt's end; for one that never ran, its last change)."""
        if self.managed.state not in MANAGED_TERMINAL_STATES:
            return None
        return max((a.ended_at for a in self.attempts if a.ended_at), default=None) or self.managed.updated_at

    def run_seconds(self, now: float) -> float | None:
        """How long its attempts have run, all of them together (a live one until `now`); None before
        one has started."""
        started = [a for a in self.attempts if a.started_at]
        return sum(max(0.0, (a.ended_at or now) - a.started_at) for a in started) if started else None

    def to_json(self, kinds: Mapping[str, str] | None = None) -> dict[str, object]:
        """`kinds`: each place's kind (slurm, ssh, k8s) by name, for `infra`; Slurm where not given."""
        latest = self.latest
        return {
            "job_id": self.job.id, "name": self.job.name, "owner": self.job.owner, "state": self.managed.state,
            "reason": self.managed.reason, "cluster": latest.cluster if latest else None,
            "partition": latest.partition if latest else None,
            "infra": place_name(latest.cluster, latest.partition, kinds) if latest else None,
            **handle_fields(latest.handle if latest else None), "attempts": len(self.attempts),
            "attempt_state": latest.state if latest else None, "restarts_on_errors": self.managed.restarts_on_errors,
            "recoveries": self.managed.recoveries, "moves": self.managed.moves, "job_rank": self.job.job_rank,
            "created_at": self.job.created_at, "ended_at": self.ended_at, "run_seconds": self.run_seconds(time.time()),
            "expected_start": latest.expected_start if latest and latest.state == JobState.PENDING else None,
            "pipeline": ({"id": self.managed.pipeline_id, "name": self.managed.pipeline_name,
                          "task": self.managed.pipeline_stage,
                          "execution": "parallel" if self.managed.pipeline_parallel else "serial",
                          "auxiliary": self.managed.auxiliary}
                         if self.managed.pipeline_id else None),
        }


def record(store: Store, task: Task, source: str, num_jobs: int = 1, owner: str = "") -> list[str]:
    """One managed job per copy: `num_jobs` of a task, or one per --array task of a job script."""
    from corral.script_task import script_copies

    check_num_jobs(num_jobs)
    num_jobs = script_copies([(task, source)], num_jobs)
    ids = store.new_job_ids(num_jobs)
    sweep = ids[0] if num_jobs > 1 else None
    row = _job_row(task, source, owner)
    store.add_managed_jobs([{**row, "id": job_id, "job_rank": i, "num_jobs": num_jobs, "sweep_id": sweep}
                            for i, job_id in enumerate(ids)])
    return ids


def record_pipeline(store: Store, name: str, tasks: list[tuple[Task, str]], owner: str = "", *,
                    parallel: bool = False, primary_tasks: list[str] | None = None,
                    termination_delay: Any = None) -> list[str]:
    """A managed pipeline: one managed job per task, in the order they run; each starts once the one
    before it has succeeded (controller/rules.py). With `parallel`, a job group: its tasks run side by
    side on one cluster, and those not in `primary_tasks` are stopped `termination_delay` after the
    primary ones have ended (jobgroup.py). Returns their ids, the first one standing for the whole."""
    kind = "job group" if parallel else "pipeline"
    if not 1 <= len(tasks) <= MAX_PIPELINE_TASKS:
        raise TaskError(f"a {kind} has 1 to {MAX_PIPELINE_TASKS} tasks, not {len(tasks)}")
    try:
        check_line(name, f"the {kind}'s name", max_length=MAX_NAME_LENGTH)
    except ValueError as exc:
        raise TaskError(str(exc)) from None
    delays = (auxiliary_delays([task.name for task, _ in tasks], primary_tasks, termination_delay, f"job group {name!r}")
              if parallel else None)
    if not parallel and (primary_tasks is not None or termination_delay is not None):
        raise TaskError("primary_tasks and termination_delay belong to a job group (`execution: parallel`)")
    rows = [_job_row(task, source, owner) for task, source in tasks]  # every task checked before any is recorded
    ids = store.new_job_ids(len(tasks))
    store.add_managed_jobs([{**row, "id": job_id, "job_rank": 0, "num_jobs": 1, "sweep_id": None}
                            for row, job_id in zip(rows, ids)], pipeline_name=name, parallel=parallel, delays=delays)
    return ids


def _job_row(task: Task, source: str, owner: str) -> dict[str, object]:
    """A managed job's `jobs` columns but its id and place in a sweep."""
    job_environment(task, source)  # a null env without --env fails here, not in the controller
    return {"name": task.name or "task", "task_json": redacted_json(task),
            "secrets_sealed": seal(resolved_secrets(task, source)), "created_at": time.time(),
            "submitter": None, "allocation": None, "owner": owner}


def views(store: Store, job_ids: list[str] | None = None, scope: str | None = None,
          live_only: bool = False) -> list[ManagedView]:
    """Managed jobs (all, or those named; with `live_only`, those not ended); `scope`: only that owner's."""
    managed = {m.job_id: m for m in store.managed(job_ids, live_only=live_only)}
    jobs = store.jobs(managed)
    if scope is not None:
        jobs = {i: job for i, job in jobs.items() if job.owner == scope}
    attempts = store.attempts_of([i for i in managed if i in jobs])
    out = [ManagedView(jobs[i], managed[i], attempts.get(i, [])) for i in managed if i in jobs]
    return sorted(out, key=lambda v: (v.job.created_at, v.job.job_rank))


def page(store: Store, limit: int | None = 20, offset: int = 0, scope: str | None = None,
         since: float | None = None) -> tuple[list[ManagedView], int]:
    """Live managed jobs and the newest ended ones (launched since `since`, if given), newest first; and
    how many more ended ones there are."""
    ids, more = store.managed_page(limit, offset, scope=scope, since=since)
    shown = views(store, ids, scope)
    shown.sort(key=lambda v: (v.job.created_at, v.job.job_rank), reverse=True)
    return shown, more


def resolve(store: Store, ref: str, scope: str | None = None) -> ManagedView:
    """A managed job by id, id prefix or name, or a pipeline's first task by the pipeline's name; with
    `scope`, among that owner's only."""
    from corral.state.store import JobNotFoundError

    try:
        return _resolve_job(store, ref, scope)
    except JobNotFoundError:
        if ids := _pipeline_named(store, ref, scope):
            return views(store, ids[:1], scope)[0]
        raise


def _pipeline_named(store: Store, ref: str, scope: str | None) -> list[str]:
    from corral.state.store import JobNotFoundError

    ids, pipelines = store.pipeline_named(ref, scope)
    if pipelines > 1:
        raise JobNotFoundError(f"{ref!r} names several pipelines; give the id of one of its tasks (`corral jobs "
                               "queue` shows them)")
    return ids


def _resolve_job(store: Store, ref: str, scope: str | None) -> ManagedView:
    from corral.state.store import JobNotFoundError

    candidates = views(store, store.matching_ids(ref, managed_only=True, scope=scope), scope)
    matches = [v for v in candidates if v.job.id == ref] or candidates
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise JobNotFoundError(f"no managed job {ref!r}; see `corral jobs queue`")
    raise JobNotFoundError(f"{ref!r} matches several managed jobs; give more of the id")


def resolve_all(store: Store, ref: str, scope: str | None = None) -> list[ManagedView]:
    """The managed job `ref` names, or every managed job of the sweep or pipeline it names (by name)."""
    from corral.state.store import JobNotFoundError

    try:
        return [_resolve_job(store, ref, scope)]
    except JobNotFoundError:
        if ids := store.sweep_named(ref, managed_only=True, scope=scope) or _pipeline_named(store, ref, scope):
            return views(store, ids, scope)
        raise


def request_cancel(store: Store, job_ids: list[str]) -> None:
    for job_id in job_ids:
        store.set_managed(job_id, ManagedState.CANCELLING, "cancel requested", cancel_requested=True)
