"""The `/v1/dev` routes: dev allocations (`launch -c NAME`, `exec`, `status`, `down`, the ssh route).

Launching a name and waiting for it are one event stream (`plan`, `skipped`, `state` per change, then
`done` with the allocation, its nodes and the ssh alias file); with `run`, the task then runs in it in
the same stream (`ready`, `output` events, and its exit status in `done`), its files sent once. `exec` streams the command's output as
`output` events (base64, since a job's output need not be UTF-8), then `done` with the exit status.
Requests for one name take turns on the server's event loop: two at once give one allocation.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse
from pydantic import Field

from corral import buckets
from corral.client import Client
from corral.controller.auth import Forbidden, Me, Principal
from corral.controller.background import run_on
from corral.controller.refusals import STREAM_REFUSALS, RequestBody
from corral.controller.v1_launch import (
    JsonLines,
    Overrides,
    Put,
    TaskInput,
    build_task,
    event_stream,
    launch_events,
    put_warnings,
)
from corral.dev import WAITING_PHASES, AllocationStatus, DevAllocations, check_name, not_ready_error
from corral.errors import CorralError
from corral.infra.base import AllocationPhase
from corral.launch import Launcher
from corral.state import Store
from corral.state.models import AllocationRow
from corral.task import Task
from corral.task_compat import autostop_minutes
from corral.views import handle_fields, place_kinds, place_name

Name = Annotated[str, Path(min_length=1, max_length=64)]


class DevLaunchRequest(RequestBody):
    task: TaskInput = Field(default_factory=TaskInput)
    overrides: Overrides = Field(default_factory=Overrides)
    idle_minutes: float | None = Field(None, ge=0, le=525_600)
    default_idle_minutes: float | None = Field(None, ge=0, le=525_600,
                                               description="When neither idle_minutes nor the task's autostop says")
    walltime: Annotated[str, Field(max_length=64)] | None = None
    wait: bool = Field(True, description="Stream until the allocation is ready (or has failed)")
    run: bool = Field(False, description="Once ready, run the task's `run` in it as `exec` does: its output "
                                         "as `output` events, its exit status in `done`. It waits until the "
                                         "allocation is ready, whatever `wait` says")
    setup: bool = Field(True, description="Run the task's `setup`: a new allocation's holder runs it on every node "
                                          "before it is ready; with `run`, a live allocation reused runs it again "
                                          "first, as `sky launch` on an existing cluster does. False (`--no-setup`): "
                                          "neither")
    detach: bool = Field(False, description="With `run`: answer `done` (with its `job_id`, no exit status) once "
                                            "the run has started, as `sky launch -d`")


class DevAutostopRequest(RequestBody):
    idle_minutes: float = Field(ge=0, le=525_600, description="Release each allocation once idle this long, counted "
                                                              "from now (0: never), as `sky autostop -i`")
    names: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list, max_length=1000,
                              description="The allocations (yours); none: all of yours")


class DevExecRequest(RequestBody):
    task: TaskInput
    overrides: Overrides = Field(default_factory=Overrides)
    detach: bool = Field(False, description="Answer `done` (no exit status) once the exec has started, as "
                                            "`sky exec -d`: it runs on, its output kept for GET /jobs/{job}/logs")


def output_events(put: Put) -> Callable[[bytes], None]:
    """A job's output as `output` events (base64: it need not be UTF-8)."""
    return lambda chunk: put({"event": "output", "data": base64.b64encode(chunk).decode()})


def started_event(put: Put) -> Callable[[str], None]:
    """The exec's job id as a `started` event, before its output: what a client that stops following
    needs to say how to follow it again."""
    return lambda job_id: put({"event": "started", "job_id": job_id})


async def detached_exec(allocations: DevAllocations, name: str, task: Task, source: str, wake: Callable[[], None],
                        setup: bool = False, status: AllocationStatus | None = None) -> dict[str, Any]:
    """Start an exec that runs on without anyone following it: its job id once it is recorded, and
    `queued` (the allocation's state) when the allocation is still waiting, as the exec then is until it
    is ready (the engine starts it). The allocation is asked first (one round trip) unless `status` is
    how it is now, so that one that ended is an error now, not a failed job later. `wake`: the engine's
    next tick now, and at its working pace while execs are queued."""
    if status is None:
        [status] = await allocations.status([allocations.get(name)])
    if status.state in WAITING_PHASES:
        job_id = await allocations.queue_exec(name, task, source, status, setup=setup)
        wake()
        return {"job_id": job_id, "queued": status_json(status)}
    if status.state != AllocationPhase.READY:
        raise not_ready_error(name, status)
    started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    running = run_on(allocations.exec(name, task, source, lambda chunk: None, started.set_result, setup=setup))
    running.add_done_callback(lambda done: done.cancelled() or done.exception())  # its end is in the store
    await asyncio.wait({started, running}, return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        running.result()  # it failed before it was recorded: that error
    return {"job_id": started.result(), "queued": None}


def status_json(status: AllocationStatus, kinds: dict[str, str] | None = None) -> dict[str, Any]:
    """`kinds`: place_kinds(), read once for a list."""
    return {**status.to_json(time.time()), "infra": where_held(status.row, kinds)}


def where_held(row: AllocationRow, kinds: dict[str, str] | None = None) -> str:
    """The allocation's place as launch writes it: slurm/<cluster>/<partition>, ssh/<pool>."""
    return place_name(row.cluster, row.partition, place_kinds() if kinds is None else kinds)


def add_routes(router: APIRouter, store: Store, wake: Callable[[], None] = lambda: None,
               slow: Callable[[], dict[str, str]] = dict) -> None:
    """`slow`: the clusters a new allocation leaves out now, with why (their status queries are overdue).
    `wake`: tick the engine now (an exec was queued)."""
    def dev(me: Principal, put: Put | None = None) -> DevAllocations:
        """`me`'s allocations (names are per user; an admin's listing shows everyone's)."""
        client = Client()
        launcher = Launcher(client, store, launch_events(put or (lambda e: None)), owner=me.owner, slow=slow())
        return DevAllocations(client, store, launcher, sees_all=me.scope is None, local=me.local)

    @router.post("/dev/{name}", response_class=JsonLines, responses=STREAM_REFUSALS)
    async def dev_launch(me: Me, name: Name, request: DevLaunchRequest) -> StreamingResponse:
        """Hold a named allocation (or reuse a live one of the same shape), then wait until it is ready."""
        check_name(name)
        task, source = build_task(request.task, request.overrides, me.owner, scripts=False)

        # --idle-minutes, else the task's SkyPilot autostop (true: 5 minutes; false: never), else the default
        idle_minutes = next((m for m in (request.idle_minutes, autostop_minutes(task), request.default_idle_minutes)
                             if m is not None), None)

        async def work(put: Put) -> dict[str, Any]:
            nonlocal task
            put_warnings(put, task, source, dev=True, text=request.task.yaml)
            if not request.setup:  # `--no-setup`: not on a live allocation, nor by a new one's holder
                task = task.model_copy(update={"setup": None})
            task = await buckets.fetched(task, me.owner, lambda d: put({"event": "step", "step": "fetch", "detail": d}))
            allocations = dev(me, put)
            async with allocations.name_lock(name):
                row, new = await allocations.launch(name, task, source, idle_minutes, request.walltime)
                if not new and request.idle_minutes is not None:  # `sky launch -c NAME -i M` on a live one
                    await allocations.set_idle_limit(row, request.idle_minutes)
            answer: dict[str, Any] = {"name": name, "cluster": row.cluster, "partition": row.partition,
                                      "infra": where_held(row), **handle_fields(row.handle), "new": new}
            setup_again = request.setup and not new and bool(task.setup)  # a new one's holder runs it
            runs = request.run and bool(task.run or setup_again)
            if not (request.wait or runs):
                return answer
            # Detached, a run waits for the allocation in the server's queue, not here: once Slurm has
            # queued the allocation (it is pending, with a reason), the run is queued in it and this
            # returns. So does a client that goes away (Ctrl-C) while it waits: its run is queued too.
            status = await allocations.wait_ready(
                row, on_state=lambda s: put({"event": "state", "state": s.state, "reason": s.reason,
                                       "expected_start": s.expected_start}),
                on_setup_output=output_events(put) if new and task.setup else None,
                until_queued=request.detach and runs, give_up=lambda: runs and gone.is_set())
            if status.state is not AllocationPhase.READY:
                queued = await detached_exec(allocations, name, task, source, wake, setup_again, status)
                return {**answer, "nodes": [], "ssh_alias": None, **queued, "exit_code": None}
            alias = await allocations.write_ssh_alias(row, status)
            answer |= {"nodes": status.nodes, "ssh_alias": str(alias) if alias else None}
            if runs:
                put({"event": "ready", **answer})
                if request.detach:
                    return {**answer, **await detached_exec(allocations, name, task, source, wake, setup_again, status),
                            "exit_code": None}
                job_id, code = await allocations.exec(name, task, source, output_events(put),  # syncs its files
                                                      started_event(put), setup=setup_again)
                return {**answer, "job_id": job_id, "exit_code": code}
            if task.workdir or task.file_mounts:
                put({"event": "step", "step": "sync", "detail": f"copying the task's files to {name}"})
                await allocations.sync_files(name, task)
            return answer

        gone = asyncio.Event()
        return event_stream(work, gone)

    @router.post("/dev/{name}/exec", response_class=JsonLines, responses=STREAM_REFUSALS)
    async def dev_exec(me: Me, name: Name, request: DevExecRequest) -> StreamingResponse:
        """Run a task's `run` on every node of the allocation: its output as it comes, then its status."""
        allocations = dev(me)
        allocations.get(name)  # an unknown name is a 404 before the stream starts
        task, source = build_task(request.task, request.overrides, me.owner, scripts=False)

        async def work(put: Put) -> dict[str, Any]:
            ready = await buckets.fetched(task, me.owner)
            if request.detach:
                answer = {**await detached_exec(allocations, name, ready, source, wake), "exit_code": None}
            else:  # an allocation not ready yet: it waits in the queue, and the client follows it
                queued: list[AllocationStatus] = []
                job_id, code = await allocations.exec(name, ready, source, output_events(put), started_event(put),
                                                      on_queued=queued.append)
                answer = {"job_id": job_id, "exit_code": code, "queued": status_json(queued[0]) if queued else None}
                if queued:
                    wake()
            if answer["queued"]:  # said before the answer, which the SDK's dev_exec reduces to the job id
                put({"event": "queued", "job_id": answer["job_id"], "allocation": answer["queued"]})
            return answer

        return event_stream(work)

    @router.get("/dev")
    async def dev_status(me: Me, name: Annotated[list[str], Query(max_length=1000)] = []  # noqa: B006
                         ) -> dict[str, object]:
        """Dev allocations (yours, or everyone's for an admin; or those named): state, nodes, idle time,
        walltime left; one round trip per cluster."""
        allocations = dev(me)
        rows = [allocations.get(n) for n in name] if name else None
        kinds = place_kinds()
        return {"allocations": [{**status_json(s, kinds), "ssh_command": allocations.copyable_ssh(s)}
                                for s in await allocations.status(rows)]}

    @router.delete("/dev")
    async def dev_down_all(me: Me) -> dict[str, object]:
        """Release every dev allocation of yours (an admin's own too, never other users'), as `sky down -a`;
        one that cannot be taken down is reported and the others still are."""
        allocations = dev(me)
        released: list[str] = []
        failed: list[dict[str, str]] = []
        for row in store.allocations(me.owner):
            async with allocations.name_lock(row.name):
                try:
                    if await allocations.down(row.name):
                        released.append(row.name)
                except CorralError as exc:
                    failed.append({"name": row.name, "error": str(exc)})
        return {"released": released, "failed": failed}

    @router.patch("/dev")
    async def dev_autostop(me: Me, request: DevAutostopRequest) -> dict[str, object]:
        """A new idle limit (0: never) for the allocations named, or all yours, their idle time counted
        from now (`sky autostop`); each holder takes it on its next poll. Those not live are `not_live`,
        unchanged."""
        changed, not_live = await dev(me).set_idle_limits(request.names, request.idle_minutes)
        kinds = place_kinds()
        return {"allocations": [status_json(s, kinds) for s in changed],
                "not_live": [status_json(s, kinds) for s in not_live]}

    @router.delete("/dev/{name}")
    async def dev_down(me: Me, name: Name) -> dict[str, object]:
        """Release the allocation (cancel marker, scancel) and clean its files and ssh alias."""
        allocations = dev(me)
        async with allocations.name_lock(name):
            released = await allocations.down(name)
        return {"name": name, "released": released}

    @router.get("/dev/{name}/ssh")
    async def dev_ssh(me: Me, name: Name, command: Annotated[str | None, Query(min_length=1, max_length=8192)] = None
                      ) -> dict[str, object]:
        """The ssh command line that opens a shell (or runs `command`) on the head node. It uses this
        server's ssh configuration and keys: only for the server's own account (a client on the same
        machine); refused (403) to a team server's users."""
        if not me.local:
            raise Forbidden("`corral ssh` through a team server is not available yet: its ssh command would use "
                            "the server's own keys. Reach the node with your own ssh login instead")
        return {"argv": await dev(me).ssh_argv(name, command)}
