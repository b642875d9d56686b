"""The server's versioned API (`/v1`): every operation the CLI and the SDK perform runs here, in the one
process that holds the store, the ControlMasters and the controller loop.

Handlers are `async def` on the controller's event loop: remote calls overlap with ticks, and store calls
are short and synchronous (SQLite allows one writer; the loop is it). Handlers raise CorralErrors as the
engine does; the app's handler (api.py) answers `{"detail": {"message", "kind", "exit_code"}}` with 404
for an unknown job or cluster, 403 for what is not the user's, else 400 (refusals.py, which also
describes them in the OpenAPI document), and the CLI prints the message as it would its own.

Every handler acts for `Me`, the request's user (auth.py): a user sees, follows and cancels only their
own jobs (another user's job is "not found", as if it did not exist); an admin sees everyone's. The GPU
view and cluster checks are shared.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse
from pydantic import Field

from corral import managed
from corral.client import Client, check_json, cluster_json, health_json
from corral.controller import v1_dev, v1_launch, v1_users, web
from corral.controller.auth import Me, Principal, owner_of_all
from corral.controller.refusals import REFUSALS, STREAM_REFUSALS, RequestBody
from corral.controller.routing import RawPathRoute
from corral.controller.v1_launch import JsonLines, OutputStream, stream_output
from corral.errors import CorralError, TaskError
from corral.infra.base import JobState
from corral.profiles import named_paths, profile_warnings
from corral.state import Store
from corral.state.store import JobFilter, JobNotFoundError, JobView
from corral.tracker import RefreshReport, SharedRefresh, Tracker, left_out
from corral.views import handle_fields, job_json, place_kinds, place_name, sweeps_named_by_first_job

Timeout = Annotated[float | None, Query(ge=1, le=3600, description="Most seconds to wait for each cluster")]
InAllocation = Annotated[str | None, Query(min_length=1, max_length=200, description=(
    "A dev allocation of yours: `job` is one run in it, its number there (1, 2, …) or its id or name"))]


class CancelRequest(RequestBody):
    jobs: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list, max_length=10_000)
    all: bool = Field(False, description="Every live job of yours (with `all_users`, everyone's).")
    all_users: bool = Field(False, description="With `all`: every user's live jobs, not only yours (admins only).")



# Slurm's state names and short forms (squeue -t) for Corral's states, where they mean the same.
SLURM_STATES = {"PD": "PENDING", "R": "RUNNING", "CF": "STARTING", "CONFIGURING": "STARTING", "CD": "SUCCEEDED",
                "COMPLETED": "SUCCEEDED", "F": "FAILED", "CA": "CANCELLED", "CG": "CANCELLING"}


def not_run_in(allocation: str, job_ids: list[str]) -> str:
    return f"{', '.join(job_ids)} did not run in dev allocation {allocation!r}; `corral queue {allocation}` lists its jobs"


def job_states(text: str) -> str:
    """`state` of GET /jobs as the store reads it: comma-separated job states or `live`, in any case,
    Slurm's names taken for Corral's; TaskError naming what is accepted."""
    names = {s.value for s in JobState}
    states = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        wanted = "live" if part.lower() == "live" else SLURM_STATES.get(part.upper(), part.upper())
        if wanted != "live" and wanted not in names:
            raise TaskError(f"unknown job state {part!r}: use live, one of {', '.join(sorted(names))}, or Slurm's "
                            f"{', '.join(SLURM_STATES)}; several with commas")
        states.append(wanted)
    return ",".join(dict.fromkeys(states))


API_FRESH_WITHIN = 5.0  # seconds: how old a finished refresh may be for a request not to wait for a running one
API_WAIT_AT_MOST = 3.0  # seconds a request waits for a refresh; past it, a cluster not yet answered is as last seen


def create_router(store: Store, refreshes: SharedRefresh | None = None,
                  wake: Callable[[], None] = lambda: None) -> APIRouter:
    """`wake`: tick the controller now (new managed work)."""
    router = APIRouter(prefix="/v1", responses=REFUSALS, route_class=RawPathRoute)  # a name may hold a slash
    shared = refreshes or SharedRefresh()

    def slow() -> dict[str, str]:  # clusters whose status query is overdue: a launch does not wait for them
        return left_out(shared.flights.overdue(API_WAIT_AT_MOST))

    v1_launch.add_routes(router, store, wake, slow)
    v1_dev.add_routes(router, store, wake, slow)
    v1_users.add_routes(router, store)
    web.add_api_routes(router, store)

    async def refreshed(fresh_within: float = API_FRESH_WITHIN,
                        at_most: float | None = API_WAIT_AT_MOST) -> RefreshReport:
        """Slurm's view of every live job, from one query per cluster shared with the controller's tick
        (or, while one runs, the last one if it is recent enough: a request does not wait for it); a
        cluster that has not answered within `at_most` seconds, or whose last answer was a failure, is
        reported and its jobs are as last seen (it is asked all the same)."""
        return await shared.refresh(Tracker(Client(), store), fresh_within=fresh_within, at_most=at_most,
                                    skip_failing=at_most is not None)

    @router.get("/check")
    async def check(cluster: Annotated[list[str], Query(max_length=1000)] = [],  # noqa: B006 - FastAPI copies it
                    timeout: Timeout = None) -> dict[str, object]:
        """Probe each cluster (all, or those named) now, in parallel, with the user's accounts and QOS;
        `warnings` per cluster: what the probe could not read or found missing (a Kubernetes
        context's RBAC rights), and what its profile names that the cluster does not know."""
        client = Client(timeout=timeout)
        paths = {name: tuple(sorted(set(named_paths(client.profiles, name).values())))
                 for name in client.registry.names()}
        outcomes = await client.probe(cluster or None, associations=True, filesystems=paths)
        return {"clusters": [{**check_json(o, client.registry.infra_kind(o.cluster)), "warnings": [
            *o.snapshot.warnings, *profile_warnings(o.cluster, o.snapshot, client.profiles)] if o.snapshot else []}
            for o in outcomes]}

    @router.get("/clusters/{name}")
    async def cluster(name: Annotated[str, Path(max_length=256)], timeout: Timeout = None) -> dict[str, object]:
        """One cluster's nodes (state, CPUs, memory, GPUs, partitions) and partitions, from a fresh probe;
        `ok` false and `error` when it did not answer."""
        [outcome] = await Client(timeout=timeout).probe([name])
        return cluster_json(outcome)

    @router.get("/gpus")
    async def gpus(gpu: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                   infra: Annotated[str | None, Query(min_length=1, max_length=500)] = None,
                   timeout: Timeout = None,
                   max_age: Annotated[float, Query(ge=0, le=3600)] = 0) -> dict[str, object]:
        """GPUs per cluster and partition, and the clusters that did not answer, from a fresh probe of each
        cluster; with `max_age` (seconds), from the server's latest probe of a cluster where it started at
        most that long ago (shared by every caller; `clusters[].probed_at` says when each answered)."""
        client = Client(timeout=timeout)
        report = await client.gpus(gpu, infra, max_age)
        kinds = {c: client.registry.infra_kind(c) for c in {r.cluster for r in report.rows} | {
            f.cluster for f in report.failures}}
        return {"rows": [{**r.to_json(), "infra": place_name(r.cluster, r.partition, kinds)} for r in report.rows],
                "failures": [{"cluster": f.cluster, "infra": place_name(f.cluster, None, kinds),
                              "error": f.error_message, "error_kind": f.error_kind} for f in report.failures],
                "clusters": [health_json(o, kinds.get(o.cluster)) for o in report.outcomes]}

    @router.get("/usage")
    async def usage(hours: Annotated[float, Query(gt=0, le=24 * 366)] = 24) -> dict[str, object]:
        """GPU use over the last `hours`: per cluster, partition and GPU type, points of [time, GPUs in
        use, total, pending demand] (at most 240 per series: each the busiest sample of its stretch)."""
        from corral.usage import UsageSampler, series

        until = time.time()
        since = until - hours * 3600
        sampler = UsageSampler.from_env()
        return {"series": series(store.gpu_samples(since), since, until), "since": since, "until": until,
                "sample_seconds": sampler.interval, "retention_days": sampler.retention_days}

    @router.get("/queue")
    async def queue(me: Me, limit: Annotated[int, Query(ge=0, le=100_000, description="Ended jobs per page (0: "
                                                                      "the live ones only)")] = 20,
                    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
                    since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
                    allocation: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                    by_sweep: bool = False) -> dict[str, object]:
        """Live jobs and the newest ended ones, newest first, after one Slurm query per cluster."""
        report = await refreshed()
        if allocation and store.allocation(allocation, me.owner) is None and not store.queue_page(
                limit=1, allocation=allocation, scope=me.scope).views:
            from corral.dev import AllocationNotFoundError

            raise AllocationNotFoundError(allocation, [r.name for r in store.allocations(me.owner)])
        shown = store.queue_page(limit=limit, offset=(page - 1) * limit, since=since, allocation=allocation,
                                 by_sweep=by_sweep, scope=me.scope)
        kinds, numbers = place_kinds(), allocation_numbers(me, allocation)
        return {"jobs": [numbered(job_json(v, kinds), numbers) for v in shown.views], "more": shown.more,
                "sweeps": shown.sweeps,
                "sweep_times": {sweep: list(times) for sweep, times in shown.sweep_times.items()},
                "warnings": [f"could not refresh {cluster}: {error}" for cluster, error in report.errors.items()]}

    @router.get("/jobs")
    async def jobs(me: Me, owner: Annotated[str, Query(max_length=128)] = "",
                   state: Annotated[str, Query(max_length=256)] = "",
                   cluster: Annotated[str, Query(max_length=256)] = "",
                   name: Annotated[str, Query(max_length=256)] = "",
                   since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
                   allocation: Annotated[str, Query(max_length=200)] = "",
                   sweep: Annotated[str, Query(max_length=64)] = "",
                   limit: Annotated[int, Query(ge=1, le=1000)] = 50,
                   page: Annotated[int, Query(ge=1, le=1_000_000)] = 1) -> dict[str, object]:
        """One page of jobs, newest first, after one Slurm query per cluster: those of `owner`, whose
        latest attempt is in `state` (one, or several comma-separated: a job state, `live` for any
        unfinished one, or Slurm's name or short form, `PD`, `R`, `CD`…), on `cluster`, with `name` in
        their name, launched since `since`, run in dev allocation `allocation`, of the sweep whose id
        is `sweep` (or that one job); and how many match in all. `managed`: the controller drives it
        (cancel it as a managed job), `managed_state` its state there."""
        report = await refreshed()
        wanted = JobFilter(owner, job_states(state), cluster, name, since, allocation, sweep)
        shown, total = store.job_page(wanted, limit=limit, offset=(page - 1) * limit, scope=me.scope)
        managed_states = {m.job_id: m.state for m in store.managed(v.job.id for v in shown)}
        kinds, numbers = place_kinds(), allocation_numbers(me, allocation)
        return {"jobs": [numbered({**job_json(v, kinds), "managed": v.job.id in managed_states,
                                   "managed_state": managed_states.get(v.job.id)}, numbers) for v in shown],
                "total": total,
                "page": page,
                "pages": max(1, -(-total // limit)),
                "warnings": [f"could not refresh {c}: {error}" for c, error in report.errors.items()]}

    @router.get("/queue/all", response_class=JsonLines, responses=STREAM_REFUSALS)
    async def queue_all(me: Me, since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
                        allocation: Annotated[str | None, Query(min_length=1, max_length=200)] = None) -> StreamingResponse:
        """Every job, newest first, one JSON object per line, after one Slurm query per cluster."""
        await refreshed()

        kinds = place_kinds()

        async def rows() -> AsyncIterator[bytes]:
            batch: list[str] = []
            for view in store.iter_queue(since=since, allocation=allocation, scope=me.scope):
                batch.append(json.dumps(job_json(view, kinds)))
                if len(batch) == 500:
                    yield ("\n".join(batch) + "\n").encode()
                    batch = []
                    await asyncio.sleep(0)  # let ticks and other requests run between chunks
            if batch:
                yield ("\n".join(batch) + "\n").encode()

        return JsonLines(rows())

    def allocation_numbers(me: Principal, allocation: str | None) -> dict[str, int]:
        """Job id -> its number in `me`'s dev allocation `allocation` (1 for the first run in it), as
        `sky queue CLUSTER` numbers a cluster's jobs; {} for no allocation, or one that is gone."""
        row = store.allocation(allocation, me.owner) if allocation else None
        if row is None:
            return {}
        return {job_id: n for n, job_id in enumerate(store.allocation_job_ids(row.name, me.owner, row.created_at), 1)}

    def numbered(job: dict[str, object], numbers: dict[str, int]) -> dict[str, object]:
        number = numbers.get(str(job["job_id"]))
        return {**job, "number": number} if number is not None else job

    def resolve_in(me: Principal, ref: str, allocation: str | None) -> JobView:
        """The job `ref` names (or a dev allocation's newest job); with `allocation`, one run in that dev
        allocation of `me`'s: its number there (`sky logs CLUSTER 2`) or its id, name, …"""
        if allocation is None:
            return store.resolve_or_newest_in(ref, me.scope)
        if ref.isdigit():
            if store.allocation(allocation, me.owner) is None:
                from corral.dev import AllocationNotFoundError

                raise AllocationNotFoundError(allocation, [r.name for r in store.allocations(me.owner)])
            numbers = {n: job_id for job_id, n in allocation_numbers(me, allocation).items()}
            if int(ref) not in numbers:
                held = f"its jobs are 1 to {len(numbers)}" if numbers else "no job has run in it yet"
                raise JobNotFoundError(f"dev allocation {allocation!r} has no job {ref}: {held}; `corral queue "
                                       f"{allocation}` lists them")
            return store.views([numbers[int(ref)]])[0]
        view = store.resolve(ref, me.scope)
        if view.job.allocation != allocation:
            raise JobNotFoundError(not_run_in(allocation, [view.job.id]))
        return view

    @router.get("/jobs/{job}")
    async def job(me: Me, job: Annotated[str, Path(max_length=200)], allocation: InAllocation = None
                  ) -> dict[str, object]:
        """One job by id, unique id prefix, unique name or Slurm job id (or a dev allocation's newest job),
        refreshed; with `allocation`, a job run in it, as `sky logs CLUSTER JOB_ID` names one."""
        view = resolve_in(me, job, allocation)
        await refreshed()
        return numbered(job_json(store.views([view.job.id])[0], place_kinds()), allocation_numbers(me, allocation))

    @router.get("/jobs/{job}/logs", response_class=OutputStream, responses=STREAM_REFUSALS)
    async def logs(me: Me, job: Annotated[str, Path(max_length=200)], follow: bool = False,
                   tail: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
                   allocation: InAllocation = None, stderr: bool = False) -> StreamingResponse:
        """The job's output, all nodes (with `tail` > 0, the last `tail` lines); with `follow`, streamed
        until its tasks are over. `job` and `allocation` as for GET /jobs/{job}. `stderr`: the file of its
        own that an sbatch script's `--error` sends stderr to (404 where stderr is in the output)."""
        view = resolve_in(me, job, allocation)
        tracker = Tracker(Client(), store)
        tracker.check_logs(view, stderr)  # a refusal is an error answer, not a line in the job's output
        return stream_output(lambda sink: tracker.logs(view, follow, sink, tail, stderr))

    def in_allocation(me: Principal, refs: list[str], every: bool) -> tuple[str | None, list[str]]:
        """`sky cancel CLUSTER JOB…`: a first reference that names one of your dev allocations (and no job)
        keeps the others, or --all, to the jobs run in it; the rest of the references."""
        if not refs or store.allocation(refs[0], me.owner) is None or store.matching_ids(refs[0], scope=me.scope):
            return None, refs
        name, rest = refs[0], refs[1:]
        if not rest and not every:
            raise TaskError(f"{name!r} is a dev allocation: `corral cancel {name} --all` cancels the jobs running in "
                            f"it (or name them after it), `corral down {name}` releases it")
        return name, rest

    @router.post("/cancel")
    async def cancel(me: Me, request: CancelRequest) -> dict[str, object]:
        """Cancel jobs (or every live one), one scancel per cluster. A first entry of `jobs` that names one
        of your dev allocations, and no job, means the jobs run in it: the others named (by their
        number there too), or with `all`, all of them (as `sky cancel CLUSTER JOB_ID…` and `sky cancel
        CLUSTER --all`)."""
        if not request.jobs and not request.all:
            raise CorralError("name the jobs to cancel, or use --all")
        allocation, refs = in_allocation(me, request.jobs, request.all)
        tracker = Tracker(Client(), store)
        await refreshed(fresh_within=0.0, at_most=None)  # what is cancelled must be what runs now, not a while ago
        named = [] if request.all else [(ref, [resolve_in(me, ref, allocation)] if allocation is not None
                                          and ref.isdigit() else store.resolve_all(ref, me.scope)) for ref in refs]
        views = (store.views(store.live_job_ids(owner_of_all(me, request.all, request.all_users), allocation))
                 if request.all else [view for _, found in named for view in found])
        if allocation is not None and (strays := [v.job.id for v in views if v.job.allocation != allocation]):
            raise TaskError(not_run_in(allocation, strays))
        cancelled = await tracker.cancel(views)
        sweeps = sweeps_named_by_first_job(store, named, me.scope)
        return {"jobs": [{"job_id": v.job.id, "cancelled": v in cancelled, "state": v.attempt.state,
                          **({"sweep": sweeps[v.job.id]} if v.job.id in sweeps else {})} for v in views]}

    @router.get("/managed")
    async def managed_jobs(me: Me, all: bool = False,
                           limit: Annotated[int, Query(ge=0, le=100_000, description="Ended managed jobs per page "
                                                                                    "(0: the live ones only)")] = 20,
                           page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
                           since: Annotated[float | None, Query(ge=0, le=1e11, description="Only ended managed jobs "
                                                               "launched at or after this Unix time")] = None
                           ) -> dict[str, object]:
        """Live managed jobs and the newest ended ones (`limit` a page; `all`: every one), newest first."""
        shown, more = managed.page(store, None if all else limit, 0 if all else (page - 1) * limit, me.scope,
                                   since=since)
        kinds = place_kinds()
        return {"jobs": [v.to_json(kinds) for v in shown], "more": more}

    @router.get("/managed/{job}")
    async def managed_job(me: Me, job: Annotated[str, Path(max_length=200)]) -> dict[str, object]:
        """One managed job, its attempts and its events; for a pipeline's task, the pipeline's tasks' ids in
        the order they run (`pipeline_tasks`) with their names (`pipeline_task_names`), and for a job
        group's, which of them are auxiliary (`pipeline_auxiliary`). A pipeline's name stands for its
        first task."""
        view = managed.resolve(store, job, me.scope)
        kinds = place_kinds()
        events = [{"at": e.at, "state": e.state, "reason": e.reason} for e in store.events(view.job.id)]
        attempts = [{"number": a.number, "cluster": a.cluster, "partition": a.partition,
                     "infra": place_name(a.cluster, a.partition, kinds),
                     **handle_fields(a.handle), "state": a.state, "reason": a.reason,
                     "submitted_at": a.submitted_at, "started_at": a.started_at, "ended_at": a.ended_at,
                     "exit_code": a.exit_code, "failure": a.failure, "stderr_path": a.error_path}
                    for a in view.attempts]
        members = store.pipeline_members(view.managed.pipeline_id) if view.managed.pipeline_id else []
        return {**view.to_json(kinds), "events": events, "attempt_list": attempts,
                "pipeline_tasks": [job_id for job_id, _name, _auxiliary in members],
                "pipeline_task_names": [name for _job_id, name, _auxiliary in members],
                "pipeline_auxiliary": [job_id for job_id, _name, auxiliary in members if auxiliary]}

    return router

