"""Dev allocations: `corral launch -c NAME`, `exec`, `ssh`, `status`, `down`.

An allocation is placed like any job (the same plan, failover and idempotent token), but its batch
job holds the nodes until it is taken down, its walltime ends, or it has been idle for its idle limit
(the holder decides that on the cluster itself). Everything backend-specific is behind the infra's
`HoldsAllocations` capability (for Slurm, `infra/slurm/devscript.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral import devssh
from corral.client import Client
from corral.errors import (
    EXIT_DATAERR,
    ClusterError,
    CorralError,
    NotFoundError,
    TaskError,
    UnavailableError,
)
from corral.gpu_names import accelerators_of, gpu_matches
from corral.infra.base import (
    EXIT_NOT_READY,
    AllocationPhase,
    AllocationState,
    FailureClass,
    FollowsSetup,
    HoldsAllocations,
    JobState,
    SubmitResult,
    holder,
    new_token,
)
from corral.infra.shell import EXEC_OUTPUT, EXEC_SETUP_FAILED, GPU_TAKEN, GPU_WAITING, exec_folder
from corral.launch import (
    Failover,
    Launcher,
    NoFeasibleClusterError,
    no_candidate_message,
    recorded_environment,
)
from corral.placement import Candidate, gres_type_of
from corral.profiles import with_prefix
from corral.state import Store
from corral.state.store import JobView
from corral.state.models import AllocationRow, AttemptRow, JobRow
from corral.views import handle_fields
from corral.state.sealed import seal
from corral.task import (
    ResourceOption,
    Task,
    parse_amount,
    job_environment,
    redacted_json,
    resolved_secrets,
    resource_options,
)

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,62}\Z", re.ASCII)
QUEUED_AFTER = 30.0  # seconds pending without a reason (not yet scheduled) after which a detached run is queued
PENDING_POLL_SECONDS = 5.0  # how often a launch that has waited a minute in Slurm's queue asks again
WAITING_PHASES = frozenset({AllocationPhase.PENDING, AllocationPhase.STARTING})
LIVE_PHASES = WAITING_PHASES | {AllocationPhase.READY}
SETUP_OUTPUT_GRACE = 5.0  # seconds a finished setup's output is still waited for
EXIT_TERMINATED = 143  # a cancelled exec's status when its session ended before it could give one (as TERM)
# Execs whose session this process holds (by job id): one that none holds (its server stopped or died
# while it ran; it runs on) is settled from its allocation's files (settle_unfollowed_execs).
FOLLOWED: set[str] = set()


class AllocationNotFoundError(NotFoundError):
    def __init__(self, name: str, known: list[str]):
        listed = ", ".join(known) if known else "none"
        create = f"`corral launch -c {name}`" if _NAME.match(name) else "`corral launch -c NAME`"
        super().__init__(f"no dev allocation {name!r}; allocations: {listed} (create one with {create})")


class AllocationMismatchError(CorralError):
    exit_code = EXIT_DATAERR


@dataclass(frozen=True)
class AllocationStatus:
    row: AllocationRow
    state: AllocationPhase
    reason: str | None
    nodes: list[str]
    started_at: float | None
    last_active: float | None
    time_left: str | None
    sshd: bool = False  # the head node has an sshd, so the ssh alias can serve editors
    ended_execs: dict[str, int] = field(default_factory=dict)  # exec job id: exit status, per its files
    setup_output: str = ""  # when its setup failed: the last lines it printed
    expected_start: float | None = None  # while pending: when the infra expects it to start, if it says

    def to_json(self, now: float) -> dict[str, object]:
        r = self.row
        return {
            "name": r.name, "owner": r.owner, "cluster": r.cluster, "partition": r.partition, "state": self.state,
            "reason": self.reason, **handle_fields(r.handle), "num_nodes": r.num_nodes, "gres": r.accelerator,
            "accelerators": accelerators_of(r.accelerator),
            "nodes": self.nodes, "age_seconds": round(now - r.created_at),
            "idle_seconds": round(now - self.last_active) if self.last_active else None,
            "idle_limit_seconds": r.idle_seconds or None, "time_left": self.time_left,
            "setup_output": self.setup_output or None, "cpus_per_node": r.held_cpus,
            "memory_gb_per_node": r.held_memory_mb / 1024 if r.held_memory_mb else None,  # exact: MB / 2**10
            "expected_start": self.expected_start, "image_id": json.loads(r.resources).get("image_id"),
        }


async def settle_unfollowed_execs(client: Client, store: Store) -> int:
    """Settle the live execs whose session no process here holds (FOLLOWED): their server stopped or
    died while they ran, and they ran on. Their allocations are asked (one status query per cluster),
    which records the end of those whose `ended` marker is there. Returns how many allocations. Execs
    still queued are not among them: `start_queued_execs` asks about theirs on every tick."""
    unfollowed = {(owner, name) for job_id, owner, name in store.live_execs() if job_id not in FOLLOWED}
    rows = [row for owner, name in sorted(unfollowed) if (row := store.allocation(name, owner)) is not None]
    if rows:
        await DevAllocations(client, store, Launcher(client, store)).status(rows)
    return len(rows)


async def start_queued_execs(client: Client, store: Store, spawn: Callable[[Awaitable[None]], object]) -> int:
    """Start the execs queued until their allocation is ready (`DevAllocations.queue_exec`): those
    whose allocation is ready now are handed to `spawn` (they run on as detached execs do); those of an
    allocation that ended are failed (`DevAllocations.status` settles them); the others' reasons follow
    the allocation's. One status query per cluster; none without queued execs. Returns how many wait."""
    views = store.views(store.queued_execs())
    if not views:
        return 0
    by_allocation: dict[tuple[str, str], list[JobView]] = {}
    for view in views:
        by_allocation.setdefault((view.job.owner, str(view.job.allocation)), []).append(view)
    rows = {key: row for key in by_allocation if (row := store.allocation(key[1], key[0])) is not None}
    now = time.time()
    # `down` cancels them; one whose allocation went (or another took its name) meanwhile cannot run
    gone = [view for key, group in by_allocation.items() for view in group
            if key not in rows or rows[key].handle != view.attempt.handle]
    for view in gone:
        store.move_attempt(view.attempt.token, JobState.PENDING, state=JobState.FAILED, ended_at=now,
                           reason="its allocation ended before it was ready")
        by_allocation[(view.job.owner, str(view.job.allocation))].remove(view)
    rows = {key: row for key, row in rows.items() if by_allocation[key]}
    waiting = 0
    for status in await DevAllocations(client, store, Launcher(client, store)).status(list(rows.values())):
        group = by_allocation[(status.row.owner, status.row.name)]
        if status.state is AllocationPhase.READY:
            allocations = DevAllocations(client, store, Launcher(client, store, owner=status.row.owner))
            for view in group:  # unless a cancel came first
                if store.move_attempt(view.attempt.token, JobState.PENDING, state=JobState.RUNNING, reason=None,
                                      submitted_at=now, started_at=now, expected_start=None):
                    spawn(allocations.run_queued(view))
        elif status.state in WAITING_PHASES:
            waiting += len(group)
            reason, expected = queued_reason(status), status.expected_start
            store.update_attempts({view.attempt.token: {"reason": reason, "expected_start": expected}
                                   for view in group if (view.attempt.reason, view.attempt.expected_start) !=
                                   (reason, expected)})
    return waiting


def queued_reason(status: AllocationStatus) -> str:
    """A queued exec's reason: "waiting for its allocation dev to be ready (PENDING: Resources)"."""
    why = f": {status.reason}" if status.reason else ""
    return f"waiting for its allocation {status.row.name} to be ready ({status.state}{why})"


def not_ready_error(name: str, status: AllocationStatus | None) -> UnavailableError:
    """Why an exec cannot run in allocation `name` now, from its `status` (None: not asked)."""
    if status is None:
        return UnavailableError(f"allocation {name!r} is not ready; see `corral status {name}`. `corral exec -d "
                                f"{name} …` queues a job to start once it is")
    return UnavailableError(f"allocation {name!r} is {status.state}" + (f" ({status.reason})" if status.reason else "")
                            + f"; see `corral status {name}`")


def queued_attempt(status: AllocationStatus) -> dict[str, object]:
    """An exec attempt's fields while it is queued until its allocation (as it is: `status`) is
    ready: PENDING and never sent (what `Store.queued_execs` looks for), with why and Slurm's estimate."""
    return {"state": JobState.PENDING, "submitted_at": None, "started_at": None,
            "reason": queued_reason(status), "expected_start": status.expected_start}


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise TaskError(f"invalid allocation name {name!r}: use letters, digits, '-', '_' or '.', starting with a letter")
    return name


def resources_key(task: Task) -> str:
    """What identifies an allocation's shape: GPUs, nodes, CPUs, memory, infra, and the image its setup,
    execs and shells run in."""
    option = resource_options(task.resources)[0]
    return json.dumps({"accelerator": str(option.accelerator) if option.accelerator else None,
                       "num_nodes": task.num_nodes, "cpus": str(option.cpus) if option.cpus else None,
                       "memory": str(option.memory_gb) if option.memory_gb else None,
                       "infra": str(option.infra) if option.infra.cluster else None,
                       "image_id": option.image_id}, sort_keys=True)


class DevAllocations:
    """One user's dev allocations: names are looked up among `launcher.owner`'s. `sees_all` (an admin)
    lists everyone's; `local` (the server's own user) also gets ssh aliases in this machine's config."""

    def __init__(self, client: Client, store: Store, launcher: Launcher, *, sees_all: bool = True,
                 local: bool = True):
        self.client = client
        self.store = store
        self.launcher = launcher
        self.owner = launcher.owner
        self.sees_all = sees_all
        self.local = local

    def name_lock(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The store lock under which `launch`, reuse and `down` of one of this user's names take turns,
        across processes and server replicas (locks.in_store)."""
        from corral.locks import in_store

        return in_store(self.store, "dev", f"{self.owner}/{name}")

    # ---- launch -c ----------------------------------------------------------------------------
    async def launch(self, name: str, task: Task, source: str, idle_minutes: float | None,
                     walltime: str | None) -> tuple[AllocationRow, bool]:
        """Place and hold the allocation, or reuse a live one of the same shape. Returns (row, new).
        The caller holds the name's store lock (`name_lock`): two commands launching one name at once,
        through one server or two replicas, take turns, and the second reuses the first's allocation."""
        check_name(name)
        existing = self.store.allocation(name, self.owner)
        wanted = resources_key(task)
        if existing is not None:
            [status] = await self.status([existing])
            if status.state in LIVE_PHASES:
                problem = self._unmet(existing, task)
                if problem:
                    raise AllocationMismatchError(
                        f"allocation {name!r} ({_describe(existing.resources)}) cannot run this task: it asks for "
                        f"{problem}. Use another name, or `corral down {name}` first")
                return existing, False
            self.store.delete_allocation(name, self.owner)  # ended: a new one takes the name
            devssh.forget_host_key(existing.token)
        if walltime:
            task = task.model_copy(update={"slurm": task.slurm.model_copy(update={"time": walltime})})
        envs = job_environment(task, source)
        plan = await self.launcher.plan(task, predict="when_full", holding=True)
        self.launcher.events.plan(plan)
        feasible = plan.feasible()
        if not feasible:
            raise NoFeasibleClusterError(no_candidate_message(plan))
        idle_seconds = round((idle_minutes or 0) * 60)
        session_keys, host_public_key = devssh.new_session_keys()
        rows: dict[int, AllocationRow] = {}  # by id(candidate)

        async def submit(candidate: Candidate) -> SubmitResult:
            token = new_token()
            infra = self.client.infra(candidate.cluster, self.owner)
            assert isinstance(infra, HoldsAllocations)
            request = self.launcher.job_request(task, candidate, token, (name,), envs)
            row = AllocationRow(owner=self.owner, name=name, token=token, cluster=candidate.cluster, partition=candidate.partition,
                                handle=None, num_nodes=task.num_nodes, accelerator=candidate.gres,
                                gpus_per_node=request.accelerators_per_node, resources=wanted,
                                run_dir=infra.attempt_files(request).run_dir, idle_seconds=idle_seconds,
                                created_at=time.time())
            rows[id(candidate)] = row
            self.store.put_allocation(row)  # before submitting: the token makes a retry find the job
            devssh.remember_host_key(token, host_public_key)
            return await infra.hold(request, idle_seconds, session_keys)

        def skipped(candidate: Candidate, why: str, failure: FailureClass) -> None:
            if id(candidate) in rows:
                devssh.forget_host_key(rows[id(candidate)].token)
            self.launcher.events.skipped(candidate.infra, why)

        failover = Failover()
        accepted = await failover.first_accepting(feasible, submit, skipped)
        if accepted is None:
            self.store.delete_allocation(name, self.owner)
            raise CorralError(f"no cluster accepted the allocation ({failover.summary()})")
        candidate, answer = accepted
        row = rows[id(candidate)]
        row.handle = answer.handle
        self.store.put_allocation(row)
        return row, True

    async def wait_ready(self, row: AllocationRow, timeout: float | None = None,
                         on_state: Callable[[AllocationStatus], None] = lambda s: None,
                         on_setup_output: Callable[[bytes], None] | None = None,
                         until_queued: bool = False,
                         give_up: Callable[[], bool] = lambda: False) -> AllocationStatus:
        """Until the allocation is ready; an error saying why once it cannot be. `on_setup_output`: its
        setup's output as it runs, where the infra can show it (one more session while waiting).
        `until_queued`: or until the infra has queued it (pending, with a reason: it cannot start now),
        or it has been pending for QUEUED_AFTER seconds; `give_up`: or once that says so. The status
        then says which."""
        infra = self._holder(row.cluster, row.owner)
        follower = None
        shown: list[bool] = []  # whether setup's output has been shown: the error then need not repeat it

        def show(chunk: bytes) -> None:
            shown.append(True)
            if on_setup_output is not None:
                on_setup_output(chunk)

        if on_setup_output is not None and row.handle and isinstance(infra, FollowsSetup):
            follower = asyncio.ensure_future(infra.setup_output(row.handle, row.run_dir, show))
            # The output is a courtesy: a failure to show it is not the allocation's, whose state says.
            follower.add_done_callback(lambda done: done.cancelled() or done.exception())
        queued = False
        try:
            status = await self._until_ready(row, timeout, on_state, lambda: not shown, until_queued, give_up)
            queued = status.state is not AllocationPhase.READY
            return status
        finally:
            if follower is not None:  # it stops by itself once setup is over: give it its last lines
                if not queued:  # (a queued one's setup has not begun)
                    await asyncio.wait({follower}, timeout=SETUP_OUTPUT_GRACE)
                follower.cancel()

    async def _until_ready(self, row: AllocationRow, timeout: float | None,
                           on_state: Callable[[AllocationStatus], None],
                           quote_setup: Callable[[], bool] = lambda: True,
                           until_queued: bool = False,
                           give_up: Callable[[], bool] = lambda: False) -> AllocationStatus:
        started = time.monotonic()
        last = None
        while True:
            [status] = await self.status([row])
            # A pending one's reason changes as Slurm schedules, and its estimate comes once Slurm has one.
            said = (status.state, status.reason, status.expected_start is not None)
            if said != last:
                on_state(status)
                last = said
            if status.state is AllocationPhase.READY:
                return status
            if status.state not in WAITING_PHASES:
                said = " | ".join(line.strip() for line in status.setup_output.splitlines() if line.strip())
                raise CorralError(f"allocation {row.name!r} is {status.state}"
                                  + (f": {status.reason}" if status.reason else "")
                                  + ((f"; the last lines setup printed: {said}" if quote_setup() else
                                      "; its output is above") if said else ""))
            waited = time.monotonic() - started
            if until_queued and status.state is AllocationPhase.PENDING and (status.reason or waited > QUEUED_AFTER):
                return status
            if give_up() and status.state in WAITING_PHASES:
                return status
            if timeout is not None and waited > timeout:
                raise CorralError(f"allocation {row.name!r} is still {status.state} after {timeout:g}s")
            # One squeue a second while it starts; a long wait in the queue asks less often.
            await _sleep(PENDING_POLL_SECONDS if status.state is AllocationPhase.PENDING and waited > 60 else 1.0)

    # ---- status -------------------------------------------------------------------------------
    async def status(self, rows: list[AllocationRow] | None = None) -> list[AllocationStatus]:
        """One round trip per cluster, for all its allocations."""
        if rows is None:
            rows = self.store.allocations(None if self.sees_all else self.owner)
        by_account: dict[tuple[str, str], list[AllocationRow]] = {}  # the run dirs read are the owner's
        for row in rows:
            by_account.setdefault((row.cluster, row.owner), []).append(row)
        results: dict[tuple[str, str], AllocationStatus] = {}

        async def one(account: tuple[str, str], group: list[AllocationRow]) -> None:
            submitted = [r for r in group if r.handle]
            for r in group:
                if not r.handle:
                    results[_key(r)] = AllocationStatus(r, AllocationPhase.UNKNOWN, "never reached Slurm", [], None,
                                                        None, None)
            if not submitted:
                return
            try:
                infra = self._holder(*account)
            except CorralError as exc:
                states = {}
                why = str(exc)
            else:
                states = await infra.allocation_states([(r.handle or "", r.run_dir) for r in submitted])
                why = "no answer"
            for r in submitted:
                state = states.get(r.handle or "")
                if state is not None:
                    self._note_held(r, state)
                results[_key(r)] = (AllocationStatus(r, state.phase, state.reason, state.nodes, None,
                                                    state.last_active, state.time_left, sshd=state.sshd,
                                                    ended_execs=state.ended_execs, setup_output=state.setup_output,
                                                    expected_start=state.expected_start)
                                   if state else AllocationStatus(r, AllocationPhase.UNKNOWN, why, [], None, None,
                                                                  None))

        await asyncio.gather(*(one(a, g) for a, g in by_account.items()))
        statuses = [results[_key(r)] for r in rows]
        for status in statuses:
            self._settle_execs(status)
        return statuses

    def _note_held(self, row: AllocationRow, state: AllocationState) -> None:
        """Keep what the infra gave the allocation per node, the first time its holder says."""
        if state.cpus_per_node is not None and (row.held_cpus, row.held_memory_mb) != (
                state.cpus_per_node, state.memory_mb_per_node):
            self.store.set_allocation_held(row.name, row.owner, state.cpus_per_node, state.memory_mb_per_node)
            row.held_cpus, row.held_memory_mb = state.cpus_per_node, state.memory_mb_per_node

    def _settle_execs(self, status: AllocationStatus) -> None:
        """Record the end of execs the allocation's files say are over (`ended_execs`), or that could not
        outlive it, but that the store still holds as running: their server did not see them end (it
        stopped, or lost the connection). One that this server still runs is settled the same way."""
        row, phase = status.row, status.state
        over = phase in (AllocationPhase.ENDED, AllocationPhase.FAILED)
        if not (status.ended_execs or over):
            return
        now = time.time()
        for view in self.store.views(self.store.live_job_ids(row.owner, row.name)):
            code = status.ended_execs.get(view.job.id)
            if code is not None:
                self.store.end_attempt(view.attempt.token, state=JobState.SUCCEEDED if code == 0 else JobState.FAILED,
                                       exit_code=code, ended_at=now)
            elif over:
                self.store.end_attempt(view.attempt.token, state=JobState.FAILED, ended_at=now,
                                       reason=f"its allocation ended ({status.reason or phase})")

    # ---- autostop -----------------------------------------------------------------------------
    async def set_idle_limits(self, names: list[str], idle_minutes: float
                              ) -> tuple[list[AllocationStatus], list[AllocationStatus]]:
        """A new idle limit (0: never) for the allocations named (none: all yours), counted from now, as
        `sky autostop -i`: each holder reads it on its next poll. Returns (those changed, those not live,
        left as they are). Round trips: one status query per cluster, then one per allocation."""
        rows = [self.get(name) for name in names] if names else self.store.allocations(self.owner)
        statuses = await self.status(rows)
        live = [s for s in statuses if s.state in LIVE_PHASES and s.row.handle]
        await asyncio.gather(*(self.set_idle_limit(s.row, idle_minutes) for s in live))
        now = time.time()
        return [dataclasses.replace(s, last_active=now) for s in live], [s for s in statuses if s not in live]

    async def set_idle_limit(self, row: AllocationRow, idle_minutes: float) -> None:
        """The new idle limit of one allocation its caller knows is live (one round trip)."""
        seconds = round(idle_minutes * 60)
        await self._holder(row.cluster, row.owner).set_idle_limit(row.handle or "", row.run_dir, seconds)
        row.idle_seconds = seconds
        self.store.put_allocation(row)

    # ---- exec ---------------------------------------------------------------------------------
    def _holder(self, cluster: str, owner: str) -> HoldsAllocations:
        return holder(self.client.infra(cluster, owner))

    def _unmet(self, row: AllocationRow, task: Task) -> str | None:
        """What the task asks that a live allocation does not hold (nodes included), or None."""
        if "num_nodes" in task.model_fields_set and task.num_nodes > row.num_nodes:
            return f"{task.num_nodes} nodes (it has {row.num_nodes})"
        return unmet(row, self.client.infra(row.cluster, row.owner).kind, task)

    def get(self, name: str) -> AllocationRow:
        row = self.store.allocation(name, self.owner)
        if row is None:
            raise AllocationNotFoundError(name, [r.name for r in self.store.allocations(self.owner)])
        return row

    async def exec(self, name: str, task: Task, source: str, on_output: Callable[[bytes], None],
                   on_started: Callable[[str], None] | None = None, setup: bool = False,
                   on_queued: Callable[[AllocationStatus], None] | None = None) -> tuple[str, int | None]:
        """Run the task's `run` on every node of the allocation (or on the task's num_nodes of them);
        returns (job id, exit status). `on_started` learns the job id once it is recorded, before
        anything runs. `setup`: the task's setup first, on every node, in the same job (as `sky launch`
        on a live cluster runs it again); the run only if it succeeded. `on_queued`: an allocation found
        still waiting (pending, or running its setup) gets the exec queued (`queue_exec`), this learns
        the allocation's status, and the exit status is None; without it, that is an error."""
        row, task = self._exec_task(name, task, source, setup)
        envs = job_environment(task, source)
        job_id, token = self._record_exec(row, task, source, queued=None)
        if on_started is not None:
            on_started(job_id)
        return job_id, await self._run_exec(row, job_id, token, task, envs, on_output, sync=True, on_queued=on_queued)

    async def queue_exec(self, name: str, task: Task, source: str, status: AllocationStatus,
                         setup: bool = False) -> str:
        """Record an exec that runs once the allocation, still waiting (`status`), is ready: `exec -d`
        or `launch -c -d` on a pending allocation returns at once, as `sbatch` does. Its files are
        copied now; the server starts it (`start_queued_execs`), or fails it if the allocation ends
        first. Returns its job id."""
        row, task = self._exec_task(name, task, source, setup)
        job_environment(task, source)  # a missing env is an error now, not when it starts
        await self.sync_files(name, task)
        job_id, _token = self._record_exec(row, task, source, queued=status)
        return job_id

    def _exec_task(self, name: str, task: Task, source: str, setup: bool) -> tuple[AllocationRow, Task]:
        """The allocation, and the task as the exec runs it: its nodes counted (the task's num_nodes
        where it gives one, as `sky exec` runs a 2-node task on 2 of 4 nodes, else all), its setup only
        with `setup`. A task the allocation cannot run is refused here."""
        row = self.get(name)
        if not row.handle:
            raise CorralError(f"allocation {name!r} never reached Slurm; `corral down {name}` and launch it again")
        infra = self._holder(row.cluster, row.owner)
        nodes = task.num_nodes if "num_nodes" in task.model_fields_set else row.num_nodes
        if nodes > row.num_nodes:
            raise TaskError(f"{source}: the task asks for {nodes} nodes; allocation {name!r} has {row.num_nodes}")
        if nodes < row.num_nodes and not infra.execs_on_fewer_nodes:
            raise TaskError(f"{source}: the task asks for {nodes} of the {row.num_nodes} nodes: an exec in this "
                            f"allocation runs on all of them; leave num_nodes out, or hold one of that size")
        problem = unmet(row, infra.kind, task)
        if problem:
            raise TaskError(f"{source}: allocation {name!r} cannot run this task: it asks for {problem}. Leave "
                            "those resources out to run with what it holds, or hold another allocation")
        return row, task.model_copy(update={"num_nodes": nodes, **({} if setup else {"setup": None})})

    def _record_exec(self, row: AllocationRow, task: Task, source: str,
                     queued: AllocationStatus | None) -> tuple[str, str]:
        """The exec's job and attempt rows: RUNNING, or PENDING and never sent while `queued`."""
        [job_id] = self.store.new_job_ids(1)
        token = f"exec-{secrets.token_hex(6)}"
        now = time.time()
        where: dict[str, object] = (queued_attempt(queued) if queued else
                                    {"state": JobState.RUNNING, "submitted_at": now, "started_at": now})
        self.store.add_jobs(
            [JobRow(id=job_id, name=task.name or "exec", task_json=redacted_json(task),
                    secrets_sealed=seal(resolved_secrets(task, source)),
                    created_at=now, allocation=row.name, owner=self.owner)],
            [AttemptRow(token=token, job_id=job_id, number=1, cluster=row.cluster, partition=row.partition,
                        handle=row.handle, created_at=now, run_dir=row.run_dir,
                        log_path=f"{row.run_dir}/{exec_folder(job_id)}/{EXEC_OUTPUT}", **where)],
        )
        return job_id, token

    async def run_queued(self, view: JobView) -> None:
        """Run a queued exec, already moved to RUNNING (`start_queued_execs`), its output kept in the
        allocation only; its end is recorded as a detached exec's, whatever happens (never raises)."""
        try:
            row = self.get(str(view.job.allocation))
            task = Task.model_validate_json(view.job.task_json)
            envs = recorded_environment(view.job, task, "queued exec")
        except (CorralError, ValueError) as exc:
            self.store.end_attempt(view.attempt.token, state=JobState.FAILED, ended_at=time.time(),
                                   reason=f"it could not start: {exc}")
            return
        with contextlib.suppress(CorralError):  # recorded as the exec's end already
            await self._run_exec(row, view.job.id, view.attempt.token, task, envs, lambda chunk: None, sync=False)

    async def _run_exec(self, row: AllocationRow, job_id: str, token: str, task: Task, envs: dict[str, str],
                        on_output: Callable[[bytes], None], sync: bool,
                        on_queued: Callable[[AllocationStatus], None] | None = None) -> int | None:
        """Run a recorded exec to its end and record how it ended; its exit status (None: queued, see
        `exec`)."""
        infra = self._holder(row.cluster, row.owner)
        setup = bool(task.setup)
        sent = False
        setup_failed = False

        def corral_line(line: bytes) -> None:
            nonlocal setup_failed
            text = line.decode(errors="replace")
            if text.startswith(EXEC_SETUP_FAILED):
                setup_failed = True
            elif text.startswith(GPU_WAITING) and "GPUs per node, in use by job(s)" in text:  # as `sky queue`
                self.store.move_attempt(token, JobState.RUNNING, state=JobState.PENDING, started_at=None,
                                        reason=text.removeprefix("corral: "))
            elif text.startswith(GPU_TAKEN):
                self.store.move_attempt(token, JobState.PENDING, state=JobState.RUNNING, started_at=time.time(),
                                        reason=None)

        output = OutputLines(b"corral: ", corral_line, on_output)
        FOLLOWED.add(job_id)
        try:
            if sync:
                await self.sync_files(row.name, task)
            # the cluster's profile, as for a job: its env under the task's, its prefix before the run
            settings = self.client.profiles.settings(row.cluster, row.partition, task)
            sent = True
            setup_commands = with_prefix(settings.prefix(), task.setup) if setup else None
            status = await infra.exec_in(row.handle or "", row.run_dir, job_id, task.num_nodes, row.gpus_per_node,
                                         {**settings.env, **envs}, with_prefix(settings.prefix(), task.run) or "",
                                         output, setup_commands or "", gpus_to_claim(row, infra.kind, task))
        except asyncio.CancelledError:
            if not sent:
                self.store.end_attempt(token, state=JobState.FAILED, reason="interrupted", ended_at=time.time())
            raise  # the server is stopping: the exec runs on, and its end is read from its allocation later
        except CorralError:
            [attempt] = self.store.attempts_by_token([token])
            if attempt.state not in (JobState.CANCELLING, JobState.CANCELLED):
                self.store.end_attempt(token, state=JobState.FAILED, reason="interrupted", ended_at=time.time())
                raise
            status = EXIT_TERMINATED  # `corral cancel` ended its session (a pool machine's), hence the error
        except BaseException:
            self.store.end_attempt(token, state=JobState.FAILED, reason="interrupted", ended_at=time.time())
            raise
        finally:
            FOLLOWED.discard(job_id)
        if status == EXIT_NOT_READY:  # nothing ran: the script checks first
            now = (await self.status([row]))[0] if on_queued is not None else None
            if now and now.state in WAITING_PHASES and self.store.move_attempt(token, JobState.RUNNING,
                                                                                **queued_attempt(now)):
                on_queued(now)
                return None
            self.store.end_attempt(token, state=JobState.FAILED, exit_code=status, ended_at=time.time(),
                                   reason=f"allocation {now.state}" if now else "allocation not ready")
            raise not_ready_error(row.name, now)
        state = JobState.SUCCEEDED if status == 0 else JobState.FAILED
        reason = "setup failed; the run did not start" if status != 0 and setup and setup_failed else None
        self.store.end_attempt(token, state=state, exit_code=status, reason=reason, ended_at=time.time())
        return status

    async def sync_files(self, name: str, task: Task) -> None:
        """The task's workdir and file_mounts into the allocation's folder, where `exec` runs (as
        `sky exec` syncs the workdir before it runs)."""
        if not (task.workdir or task.file_mounts):
            return
        row = self.get(name)
        self.launcher.check_local_files(task)
        infra = self._holder(row.cluster, row.owner)
        await self.launcher.upload_files(task, infra, row.run_dir)
        if row.handle:
            await infra.deliver_uploads(row.handle)

    # ---- ssh ----------------------------------------------------------------------------------
    def copyable_ssh(self, status: AllocationStatus) -> str | None:
        """The command the allocation's owner pastes for a shell on its head node: `corral ssh NAME` for
        the server's own user (its keys are this machine's); for a team member, their own ssh to the
        login node (as their ssh config names it) running a step there. None until it is ready."""
        row = status.row
        if status.state is not AllocationPhase.READY or not status.nodes or not row.handle:
            return None
        if self.local and row.owner == self.owner:
            return shlex.join(["corral", "ssh", row.name])
        try:
            remote = self._holder(row.cluster, row.owner).login_shell_command(row.handle, status.nodes[0], row.run_dir)
            login = self.client.accounts.login(row.owner, row.cluster) if self.client.accounts else None
        except CorralError:
            return None
        return shlex.join(["ssh", "-t", f"{login.user}@{row.cluster}" if login else row.cluster, remote])

    async def ssh_argv(self, name: str, command: str | None) -> list[str]:
        row = self.get(name)
        [status] = await self.status([row])
        if status.state is not AllocationPhase.READY or not status.nodes:
            raise CorralError(f"allocation {name!r} is {status.state}; cannot open a shell in it")
        return self._holder(row.cluster, row.owner).shell_argv(row.handle or "", status.nodes[0], row.run_dir, command)

    async def write_ssh_alias(self, row: AllocationRow, status: AllocationStatus) -> Path | None:
        """An ssh config Include so that plain `ssh NAME` and editors' remote-SSH reach the head node
        (for the server's own user only: it uses this machine's keys; None for anyone else)."""
        if not self.local:
            return None
        head = status.nodes[0]
        job_id = row.handle or ""
        route = await self._holder(row.cluster, row.owner).ssh_route(row.name, job_id, head, row.run_dir, status.sshd)
        entry = devssh.alias_entry(name=row.name, token=row.token, cluster=row.cluster, partition=row.partition,
                                   slurm_job_id=job_id, head_node=head, login_settings=route.login_settings,
                                   proxy_argv=route.proxy_argv, remote_command=route.remote_command)
        return devssh.set_alias(row.name, entry, self.client.registry.path)

    # ---- down ---------------------------------------------------------------------------------
    async def down(self, name: str) -> bool:
        """Release the allocation and clean its files. False if there was none (already down)."""
        row = self.store.allocation(name, self.owner)
        if row is None:
            return False
        try:
            await self._holder(row.cluster, row.owner).release(row.handle, row.run_dir)
        except ClusterError as exc:
            raise CorralError(f"could not take {name!r} down: {exc}") from exc
        self.store.delete_allocation(name, self.owner)
        ended = self.store.views(self.store.live_job_ids(row.owner, name))  # execs it ran, ended with it
        self.store.update_attempts({v.attempt.token: {"state": JobState.CANCELLED, "ended_at": time.time(),
                                                      "reason": f"its allocation {name!r} was released"}
                                    for v in ended})
        if self.local:
            devssh.set_alias(name, None, self.client.registry.path)
        devssh.forget_host_key(row.token)
        return True


def _key(row: AllocationRow) -> tuple[str, str]:
    return row.owner, row.name


class OutputLines:
    """An output sink passing chunks on as they come, that also gives `on_line` each whole line that
    starts with `prefix` (bytes, without its newline), even one split across chunks: how a server
    reads an exec's own lines (its setup failed, it waits for GPUs) from the output it streams."""

    LONGEST = 4096  # a line longer than this is not one of Corral's: not kept whole

    def __init__(self, prefix: bytes, on_line: Callable[[bytes], None], on_output: Callable[[bytes], None]) -> None:
        self.prefix, self.on_line, self.on_output = prefix, on_line, on_output
        self._partial = b""

    def __call__(self, chunk: bytes) -> None:
        self.on_output(chunk)
        *lines, partial = (self._partial + chunk).split(b"\n")
        self._partial = partial if len(partial) <= self.LONGEST else b"\0"  # never starts with the prefix
        for line in lines:
            if line.startswith(self.prefix):
                self.on_line(line)


def unmet(row: AllocationRow, kind: str, task: Task) -> str | None:
    """What of the task's resources the allocation cannot give, or None when one of its alternatives
    fits: as SkyPilot's "less demanding than" the cluster, a task may ask for less than is held (fewer
    GPUs, CPUs, memory; a wider infra; nothing at all) and runs with what the allocation holds. CPUs and
    memory count only where the allocation was held with a number of them (else it is unknown)."""
    options = resource_options(task.resources)
    if not options:
        return None
    shortfalls = [_shortfall(row, kind, option) for option in options]
    if any(not missing for missing in shortfalls):
        return None
    return "; ".join(shortfalls[0])


def gpus_to_claim(row: AllocationRow, kind: str, task: Task) -> int:
    """How many of the allocation's GPUs per node an exec of `task` takes for itself (as SkyPilot's
    job queue gives each job its own): the count its first fitting alternative names, or 0 (it names
    none, or the allocation holds none) for an exec that sees all of them and takes none."""
    for option in resource_options(task.resources):
        if not _shortfall(row, kind, option):
            return option.accelerator.count if option.accelerator is not None and row.gpus_per_node else 0
    return 0


def _shortfall(row: AllocationRow, kind: str, option: ResourceOption) -> list[str]:
    """What of one alternative of a task's resources the allocation lacks (empty when it fits)."""
    held = json.loads(row.resources)
    held_type = gres_type_of(row.accelerator)  # row.accelerator: the --gres it was held with
    out = []
    gpus = option.accelerator
    if gpus is not None and (gpus.count > row.gpus_per_node or (
            held_type is not None and not gpu_matches(gpus.name, held_type))):
        have = (f"{row.gpus_per_node} GPU{'s' if row.gpus_per_node != 1 else ''} ({held_type or 'untyped'}) "
                "per node" if row.gpus_per_node else "no GPU")
        out.append(f"{gpus} (it holds {have})")
    given = {"cpus": row.held_cpus, "memory": round(row.held_memory_mb / 1024, 2) if row.held_memory_mb else None}
    for what, asked, unit in (("cpus", option.cpus, ""), ("memory", option.memory_gb, "GB")):
        if asked is None:
            continue
        have_text = held.get(what)
        if have_text is not None:
            if parse_amount(have_text, what).value < asked.value:
                out.append(f"{what}={asked}{unit} (it holds {have_text}{unit})")
        elif given[what] is None:
            out.append(f"{what}={asked}{unit} (it was held without a number of {what}, and has not said what it got)")
        elif given[what] < asked.value:
            out.append(f"{what}={asked}{unit} (it was held without a number of {what}; the infra gave it "
                       f"{given[what]:g}{unit} per node)")
    # An exec runs in the allocation's image (or on its hosts): a task naming another cannot run there.
    # Allocations held before images were recorded ran on their hosts.
    if option.image_id and option.image_id != held.get("image_id"):
        out.append(f"image_id {option.image_id} (it runs "
                   + (f"in {held['image_id']})" if held.get("image_id") else "on its hosts, in no image)"))
    where = option.infra
    if ((where.kind and where.kind != kind) or (where.cluster and where.cluster != row.cluster)
            or (where.partition and where.partition != row.partition)):
        out.append(f"infra {where} (it is on {kind}/{row.cluster}/{row.partition})")
    return out


def _describe(resources: str) -> str:
    data = json.loads(resources)
    return ", ".join(f"{k}={v}" for k, v in data.items() if v is not None)


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)

