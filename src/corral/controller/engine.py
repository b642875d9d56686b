"""The controller: drives every managed job's state machine, one tick at a time.

A tick costs, per cluster, one status query (all jobs, batched) and, only when some managed job
needs placing or is pending, one probe; when pending jobs can start nowhere now, one prediction
round trip (`sbatch --test-only`, at most every `predict_interval` per task and for at most
`max_predicted_tasks` tasks); submissions and cancels come on top only for jobs that move. So the
Slurm RPCs per cluster per tick do not grow with the number of jobs.

State is in the store, not in this process: kill -9 it at any point and a new controller carries on.
Replicas on one store share the work by leasing clusters (shards.py): each refreshes and drives only
the jobs whose home cluster it holds, so no job is driven by two at once; a replica that dies hands its
clusters over once their leases lapse. One of them also holds the `controller` lease for the chores
done once per store. Submissions stay idempotent through their tokens (see `launch.py`).

Rules, per managed job and tick:
- no live attempt yet, or the last one failed for infrastructure reasons (node failure, preemption,
  boot failure, a job Slurm lost, a cluster unreachable beyond the grace period): a new attempt on the
  best cluster (unhealthy clusters avoided), with the latest checkpoint copied over if it moves;
  `job_recovery: none` makes such a failure final; FAILOVER tries the same cluster first and
  EAGER_NEXT_REGION another one first (`recovery_order`), where unset the soonest start decides;
- the task itself failed: FAILED, unless `max_restarts_on_errors` or `recover_on_exit_codes` say retry;
- pending while another cluster can start it now and its own cannot, or (when none can) while another
  cluster is predicted to start it sooner by a clear margin: submit there first, held, cancel the old
  attempt only once the new one is accepted, and release the new one only once Slurm says the old one
  ended without succeeding (hysteresis: pending for `reroute_after` seconds, not moved within
  `reroute_cooldown`, and for predictions the margin; see `_reroute_by_prediction`);
- an older attempt that succeeded after all (its kill was lost): the job is done, newer ones cancelled;
- two attempts running at once (a re-route race): keep the one that started first, cancel the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from corral import budget
from corral.client import Client
from corral.controller.shards import Shards, home_cluster
from corral.errors import CorralError
from corral.infra.base import (
    DEFAULT_CHECKPOINT_DIR,
    CopiesCheckpoints,
    FailureClass,
    ReleasesHeld,
    ReportsSetupFailure,
)
from corral.launch import AttemptOptions, Launcher, LaunchEvents, split_sweep
from corral.placement import Candidate, Plan
from corral.state import Store
from corral.state.models import AttemptRow, JobRow, ManagedJobRow
from corral.state.sealed import unseal
from corral.state.store import TERMINAL_STATES
from corral.task import RecoveryStrategy, Task, resolved_envs
from corral.tracker import RefreshScope, SharedRefresh, Tracker, sent_by_account

LEASE = "controller"
# How long a held replacement waits after its predecessor ended, for the task-side cancel fence: the
# watcher in TASK_SH sees the marker within a second, and a task that outlives TERM for 10 s is KILLed.
CANCEL_FENCE_SECONDS = 12.0
CHECKPOINTS_DIR = ".corral/checkpoints"


@dataclass
class ControllerSettings:
    grace_seconds: float = 60.0  # a cluster unreachable this long: its jobs recover elsewhere
    reroute_after: float = 10.0  # pending at least this long before a move is considered
    reroute_cooldown: float = 60.0  # no second move of one job within this
    reroute_margin: float = 300.0  # a predicted start must beat the current one by this many seconds…
    reroute_margin_fraction: float = 0.2  # …and by this fraction of the current wait
    predict_interval: float = 60.0  # how often a pending task's start times are predicted on every cluster
    max_predicted_tasks: int = 16  # distinct tasks predicted per tick (each is one sbatch --test-only per place)
    unhealthy_after_failures: int = 3  # infrastructure failures in a row that mark a cluster unhealthy
    unhealthy_seconds: float = 300.0  # how long an unhealthy cluster is avoided
    max_launch_failures: int = 5  # attempts in a row the infrastructure ended at once: then FAILED, not recovered
    lease_seconds: float = 30.0

    def margin(self, here_start: float, now: float) -> float:
        """How much sooner another cluster must be predicted to start a job before it moves there."""
        return max(self.reroute_margin, self.reroute_margin_fraction * max(0.0, here_start - now))

    @classmethod
    def from_env(cls) -> ControllerSettings:
        settings = cls()
        for name in ("grace_seconds", "reroute_after", "reroute_cooldown", "reroute_margin", "reroute_margin_fraction",
                     "predict_interval", "unhealthy_seconds", "lease_seconds"):
            value = os.environ.get(f"CORRAL_CONTROLLER_{name.upper()}")
            if value:
                setattr(settings, name, float(value))
        return settings


@dataclass
class TickReport:
    drove: bool  # held any cluster (or the chores lease): did anything
    chores: bool = False  # held the chores lease (usage samples, settling interrupted launches)
    clusters: list[str] = field(default_factory=list)  # the clusters this replica held and drove
    replicas: int = 1  # live replicas on the store, this one included
    jobs: int = 0  # live managed jobs this replica drove
    submitted: int = 0
    moved: int = 0
    cancelled: int = 0
    round_trips: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    disagreement: str | None = None  # why it drove nothing: replicas read different cluster lists (shards.py)


class Controller:
    def __init__(self, client: Client, store: Store, holder: str, settings: ControllerSettings | None = None):
        self.client = client
        self.store = store
        self.holder = holder
        self.settings = settings or ControllerSettings()
        self.launcher = Launcher(client, store, LaunchEvents())
        # (owner, task JSON) -> (when, plan with predicted starts): each owner's plan is their own (the
        # clusters they have an account on, the start Slurm predicts for their account).
        self._predictions: dict[tuple[str, str], tuple[float, Plan]] = {}
        self._changes: list[tuple[str, str | None, str | None, dict[str, object]]] = []  # written once per tick
        self._health_resets: set[str] = set()  # clusters with a running job this tick
        self.refreshes = SharedRefresh()  # shared with the server's API: one Slurm query per cluster at a time
        self.shards = Shards(store, holder, self.settings.lease_seconds, client.registry.names)
        self._last_tick = 0.0  # time.monotonic() at the end of the last tick

    async def tick(self) -> TickReport:
        held = self.shards.claim()
        if self.shards.disagreement:  # replicas read different cluster lists: this one does nothing
            self.store.release_lease(LEASE, self.holder)
            chores = False
        else:
            chores = self.store.acquire_lease(LEASE, self.holder, self.settings.lease_seconds)
        budget.share_between(self.shards.replicas)
        if not chores and not held:
            self.refreshes.scope = RefreshScope(clusters=frozenset(), chores=False)
            return TickReport(drove=False, replicas=self.shards.replicas, disagreement=self.shards.disagreement)
        before = dict(self.client.transport.round_trips)
        report = TickReport(drove=True, chores=chores, clusters=sorted(held), replicas=self.shards.replicas)
        # Only this replica's clusters are queried (their holders write the others' states to the store),
        # by the ticks and by the API alike.
        self.refreshes.scope = RefreshScope(clusters=frozenset(held), chores=chores)
        # Never this controller's own previous refresh; one the API made since the last tick will do.
        refresh = await self.refreshes.refresh(Tracker(self.client, self.store), newer_than=self._last_tick)
        report.errors = dict(refresh.errors)
        now = time.time()
        self._track_reachability(refresh.errors, now)
        managed = self.store.managed(live_only=True)
        if managed:
            # Attempts of every live managed job in one query; the jobs themselves (their task, sealed
            # secrets) only for the few this tick places, moves or judges: memory stays flat with 10,000.
            attempts = self.store.attempts_of_live_managed()
            configured = self.client.registry.names()
            managed = [m for m in managed if self._drives(m.job_id, attempts, configured, held, chores)]
            report.jobs = len(managed)
            if managed:
                await self._drive(managed, attempts, held, now, report)
        report.round_trips = {c: n - before.get(c, 0) for c, n in self.client.transport.round_trips.items()
                              if n - before.get(c, 0)}
        self._last_tick = time.monotonic()
        return report

    # ---- one tick over all managed jobs ---------------------------------------------------------
    @staticmethod
    def _drives(job_id: str, attempts: dict[str, list[AttemptRow]], configured: list[str], held: set[str],
                chores: bool) -> bool:
        """Is this replica the one that drives the job: does it hold the job's home cluster (shards.py)?"""
        mine = attempts.get(job_id)
        home = home_cluster(job_id, mine[-1].cluster if mine else None, configured)
        return home in held if home is not None else chores

    async def _drive(self, managed: list[ManagedJobRow], attempts: dict[str, list[AttemptRow]], held: set[str],
                     now: float, report: TickReport) -> None:
        unreachable = self._unreachable_beyond_grace(now)
        to_place: list[tuple[str, str]] = []  # (job id, why)
        pending: list[tuple[ManagedJobRow, str, AttemptRow]] = []
        to_cancel: list[AttemptRow] = []
        to_release: list[AttemptRow] = []
        for m in managed:
            job = m.job_id
            mine = attempts.get(m.job_id, [])
            live = [a for a in mine if a.state not in TERMINAL_STATES]
            latest = mine[-1] if mine else None
            if m.cancel_requested:
                to_cancel += live
                self._set(m, "CANCELLED", "cancelled by user")
                continue
            running = sorted((a for a in live if a.state in ("RUNNING", "STARTING")),
                             key=lambda a: (a.started_at or now, a.number))
            if len(running) > 1:  # a re-route raced with the old attempt starting: keep the first
                for extra in running[1:]:
                    to_cancel.append(extra)
                    self.store.update_attempt(extra.token, state="CANCELLED", ended_at=now,
                                              reason=f"duplicate of attempt {running[0].number}")
                self._changes.append((m.job_id, None, f"attempts {', '.join(str(a.number) for a in running)} "
                                      f"both started; kept attempt {running[0].number}", {}))
                latest = running[0]
            succeeded = next((a for a in mine if a.state == "SUCCEEDED"), None)
            if succeeded is not None and succeeded is not latest:
                # An attempt Corral had moved away from ran after all (its kill was lost while Slurm was
                # launching it) and succeeded: the job is done; newer attempts must not run it again.
                for extra in live:
                    to_cancel.append(extra)
                    self.store.update_attempt(extra.token, state="CANCELLED", ended_at=now,
                                              reason=f"attempt {succeeded.number} had already succeeded")
                self._set(m, "SUCCEEDED", f"attempt {succeeded.number} succeeded (it ran although it had "
                                          "been moved; later attempts cancelled)")
                continue
            if latest is None:
                to_place.append((job, "first attempt"))
                continue
            if latest.cluster in unreachable and latest.state in ("PENDING", "STARTING", "RUNNING", "SUBMITTING"):
                why = f"{latest.cluster} unreachable for more than {self.settings.grace_seconds:g}s"
                # Cancelled in Slurm as soon as the cluster answers again, so it never runs twice for long.
                self.store.update_attempt(latest.token, state="CANCELLING", reason=why)
                self._recover(m, job, why, to_place)
                continue
            state = latest.state
            if state in ("SUBMITTING", "CANCELLING"):
                continue
            if state == "PENDING" and latest.held:
                # A move's attempt waits, held, until the attempt it replaces is known not to run.
                blocking = [a for a in live if a is not latest and a.cluster not in unreachable]
                # ... and for a few seconds more: the task's own cancel fence ends a task that Slurm's
                # kill missed within a second of the cancel marker (see TASK_SH).
                fencing = [a for a in mine if a is not latest and a.state in ("CANCELLED", "FAILED")
                           and now - (a.ended_at or 0) < CANCEL_FENCE_SECONDS]
                if blocking or fencing:
                    self._set(m, "PENDING", f"attempt {latest.number} held until attempt "
                                            f"{(blocking or fencing)[0].number} is confirmed cancelled")
                else:
                    to_release.append(latest)
                continue
            if state == "PENDING":
                self._set(m, "PENDING" if m.recoveries == 0 else "RECOVERING",
                                       latest.reason or "pending")
                if now - (latest.submitted_at or now) >= self.settings.reroute_after:
                    pending.append((m, job, latest))
            elif state in ("STARTING", "RUNNING"):
                self._set(m, state, f"on {self._where(latest.cluster, latest.partition)} (attempt {latest.number})")
                self._health_resets.add(latest.cluster)  # written once per cluster, below
            elif state == "SUCCEEDED":
                self._set(m, "SUCCEEDED", f"attempt {latest.number} succeeded")
            elif state == "CANCELLED":
                if latest.reason and latest.reason.startswith(("re-routed", "duplicate")):
                    continue  # replaced by a newer attempt, which is the latest once recorded
                self._set(m, "CANCELLED", latest.reason or "cancelled in Slurm")
            elif state in ("SUBMIT_FAILED", "LOST") or _infra_failure(latest):
                why = f"attempt {latest.number} on {latest.cluster}: {latest.reason or state}"
                self._note_failure(latest.cluster, now)
                quick = launch_failures_in_a_row(mine)
                if quick >= self.settings.max_launch_failures:
                    self._set(m, "FAILED", f"{why}; not recovered again: its last {quick} attempts all ended as "
                                           "soon as they started (look at its resources and sbatch_args)")
                else:
                    self._recover(m, job, why, to_place)
            elif state == "FAILED":
                task = _task(self.store.jobs([job])[job])
                recovery = task.resources.job_recovery
                code = latest.exit_code
                if await self._setup_failed(latest):  # not retried: the same setup would fail again
                    self._set(m, "FAILED_SETUP", f"setup failed on attempt {latest.number} (exit code {code})")
                elif recovery and code is not None and code in recovery.recover_on_exit_codes:
                    self._set(m, "RECOVERING", f"exit code {code} is listed to recover")
                    to_place.append((job, f"exit code {code}"))
                elif recovery and m.restarts_on_errors < recovery.max_restarts_on_errors:
                    self._set(m, "RECOVERING",
                                           f"exit code {code}: restart {m.restarts_on_errors + 1} of "
                                           f"{recovery.max_restarts_on_errors}",
                                           restarts_on_errors=m.restarts_on_errors + 1)
                    to_place.append((job, f"exit code {code}"))
                else:
                    self._set(m, "FAILED", f"attempt {latest.number} failed "
                                           f"(exit code {code}, {latest.reason or 'FAILED'})")
        self._write_changes()
        self._write_health_resets()
        # Each cluster's holder re-cancels what is left there, whoever moved the job away from it.
        abandoned = [a for mine in attempts.values() for a in mine if a.state == "CANCELLING"
                     and a.cluster in held and a.cluster not in unreachable and a not in to_cancel]
        report.cancelled += await self._cancel(to_cancel)
        await self._release(to_release)
        # Cancelled again each tick, and left CANCELLING: the tracker settles each one from Slurm's own
        # answer, so an attempt whose kill was lost is seen running (and killed) or seen to have succeeded.
        await self._cancel(abandoned, settle=False)
        if not to_place and not pending:
            return
        rows = self.store.jobs([job for job, _ in to_place] + [job for _, job, _ in pending])
        placing = [(rows[job], why) for job, why in to_place]
        moving = [(m, rows[job], latest) for m, job, latest in pending]
        outcomes = await self.launcher.probe_for([_task(job) for job, _ in placing] +
                                                 [_task(job) for _, job, _ in moving])
        report.submitted += await self._place(placing, attempts, outcomes, unreachable, now)
        report.moved += await self._reroute(moving, attempts, outcomes, unreachable, now)

    def _recover(self, m: ManagedJobRow, job: str, why: str, to_place: list[tuple[str, str]]) -> None:
        """After an infrastructure failure: a new attempt, unless the task says `job_recovery: none`."""
        recovery = _task(self.store.jobs([job])[job]).resources.job_recovery
        if recovery is not None and recovery.strategy is RecoveryStrategy.NONE:
            self._set(m, "FAILED", f"{why}; not recovered (job_recovery: none)")
            return
        self._set(m, "RECOVERING", why, recoveries=m.recoveries + 1)
        to_place.append((job, why))

    def _set(self, m: ManagedJobRow, state: str, reason: str | None, **fields: object) -> None:
        """Note a change of a managed job, written with the others in one transaction (`_write_changes`);
        only when something changed: a quiet tick writes nothing."""
        if (state, reason) == (m.state, m.reason) and all(getattr(m, k) == v for k, v in fields.items()):
            return
        self._changes.append((m.job_id, state, reason, fields))
        m.state, m.reason = state, reason
        for key, value in fields.items():
            setattr(m, key, value)

    def _write_changes(self) -> None:
        changes, self._changes = self._changes, []
        self.store.set_managed_many(changes)

    # ---- placing new attempts -------------------------------------------------------------------
    async def _place(self, to_place: list[tuple[JobRow, str]], attempts: dict[str, list[AttemptRow]],
                     outcomes: list, unreachable: set[str], now: float) -> int:
        """Decide where every batch goes, one after the other on this tick's probe, each seeing what the
        ones before took of each place's free capacity; then submit them all at once (the transport
        and the budget bound the sessions per cluster)."""
        avoid = unreachable | self._unhealthy(now)
        taken: dict[tuple[str, str], int] = {}  # copies placed on each place this tick
        decided: list[tuple[int, list[JobRow], Task, list[Candidate]]] = []
        for number, jobs in _batches(to_place, attempts):
            if self.shards.lapsing():  # the rest wait for the next tick, under renewed leases
                break
            task = _task(jobs[0])
            plan = await self.launcher.plan(task, predict="when_full", outcomes=outcomes, owner=jobs[0].owner)
            feasible = [c for c in plan.feasible() if c.cluster not in avoid] or plan.feasible()
            before = attempts.get(jobs[0].id, [])
            recovery = task.resources.job_recovery
            feasible = recovery_order(after_taken(feasible, taken), recovery.strategy if recovery else None,
                                      before[-1].cluster if before else None)
            if not feasible:
                self.store.set_managed_many([(job.id, "PENDING", "no cluster can run it now: " + _reasons(plan), {})
                                             for job in jobs])
                continue
            for candidate, _first, count in split_sweep(feasible, len(jobs)):
                key = (candidate.cluster, candidate.partition)
                taken[key] = taken.get(key, 0) + count
            decided.append((number, jobs, task, feasible))
        submitted = await asyncio.gather(*(self._submit_batch(number, jobs, task, feasible, attempts)
                                           for number, jobs, task, feasible in decided))
        return sum(submitted)

    async def _submit_batch(self, number: int, jobs: list[JobRow], task: Task, feasible: list[Candidate],
                            attempts: dict[str, list[AttemptRow]]) -> int:
        for job in jobs:
            previous = attempts.get(job.id, [])
            await self._carry_checkpoint(job, task, previous[-1] if previous else None, feasible[0].cluster)
        try:
            shares = await self.launcher.submit_jobs(task, _environment(jobs[0], task),
                                                     feasible, jobs, _attempt_options(task, number))
        except CorralError as exc:
            self.store.set_managed_many([(job.id, None, f"submission failed: {exc}", {}) for job in jobs])
            return 0
        self.store.note_managed({
            job_id: f"attempt {number} submitted to {share.infra or self._where(share.cluster, share.partition)} "
                    f"as {share.handles[i]}"
            for share in shares for i, job_id in enumerate(share.job_ids)
        })
        return sum(len(share.job_ids) for share in shares)

    async def _carry_checkpoint(self, job: JobRow, task: Task, previous: AttemptRow | None, target: str) -> None:
        """Copy the checkpoint directory from the previous attempt's cluster to the new one."""
        if previous is None or previous.cluster == target or (task.checkpoint and not task.checkpoint.sync):
            return
        remote = _checkpoint_dir(job, task)
        source = self.client.infra(previous.cluster, job.owner)
        if not isinstance(source, CopiesCheckpoints):
            self.store.set_managed(job.id, reason=f"checkpoint not copied: {source.name} cannot copy it out")
            return
        with tempfile.TemporaryDirectory(prefix="corral-ckpt-") as tmp:
            try:
                found = await source.fetch_dir(remote, Path(tmp))
                if found:
                    await self.client.infra(target, job.owner).upload(Path(tmp), remote + "/")
                    self.store.set_managed(job.id, reason=f"checkpoint copied from {previous.cluster} to {target}")
            except CorralError as exc:
                self.store.set_managed(job.id, reason=f"checkpoint not copied from {previous.cluster}: {exc}")

    # ---- re-routing pending jobs ----------------------------------------------------------------
    async def _reroute(self, pending: list[tuple[ManagedJobRow, JobRow, AttemptRow]],
                       attempts: dict[str, list[AttemptRow]], outcomes: list, unreachable: set[str],
                       now: float) -> int:
        """Move pending jobs: to a cluster that can start them now; failing that, to one predicted to
        start them sooner by a clear margin."""
        moved = 0
        avoid = unreachable | self._unhealthy(now)
        taken: dict[tuple[str, str], int] = {}  # copies moved to each place this tick: its capacity is shared
        plans: dict[tuple[str, str], Plan] = {}  # one plan per owner's task (a sweep's jobs share it)
        waiting: list[tuple[ManagedJobRow, JobRow, AttemptRow, Task]] = []
        for m, job, current in pending:
            if now - m.last_move_at < self.settings.reroute_cooldown:
                continue
            task = _task(job)
            key = _task_key(job)
            if key not in plans:
                plans[key] = await self.launcher.plan(task, predict="never", outcomes=outcomes, owner=job.owner)
            plan = plans[key]
            here = _candidate_at(plan, current)
            if here is not None and here.startable_now:
                continue  # Slurm will start it where it is
            best = next((c for c in after_taken(plan.feasible(), taken)
                         if c.startable_now and c.cluster not in avoid
                         and (c.cluster, c.partition) != (current.cluster, current.partition)), None)
            if best is None:
                waiting.append((m, job, current, task))
                continue
            taken[(best.cluster, best.partition)] = taken.get((best.cluster, best.partition), 0) + 1
            why = (f"re-routed to {best.infra}: it can start now; {current.cluster} had it pending "
                   f"({current.reason or 'pending'})")
            moved += await self._move(m, job, current, task, best, attempts, why)
        if waiting:
            moved += await self._reroute_by_prediction(waiting, plans, attempts, avoid, now)
        return moved

    async def _reroute_by_prediction(self, waiting: list[tuple[ManagedJobRow, JobRow, AttemptRow, Task]],
                                     plans: dict[tuple[str, str], Plan], attempts: dict[str, list[AttemptRow]],
                                     avoid: set[str], now: float) -> int:
        """Nowhere can start them now: compare predicted starts. Predictions (`sbatch --test-only` on
        every candidate, one round trip per cluster for all tasks) are made per task at most every
        `predict_interval` seconds, for at most `max_predicted_tasks` tasks per tick. A job moves only
        when the best alternative beats its current start by `reroute_margin` seconds and by
        `reroute_margin_fraction` of its current wait, and only one job per task per prediction: the
        next prediction sees the job already moved."""
        tasks: dict[tuple[str, str], Task] = {}
        for _m, job, _current, task in waiting:
            tasks.setdefault(_task_key(job), task)
        due = [key for key in tasks if key not in self._predictions
               or now - self._predictions[key][0] >= self.settings.predict_interval][:self.settings.max_predicted_tasks]
        if due:
            for owner in sorted({owner for owner, _ in due}):  # each as its owner: their account's view
                keys = [key for key in due if key[0] == owner]
                fresh = [(tasks[key], plans[key]) for key in keys]
                await self.launcher.predict(fresh, owner=owner)
                for key, (_task, plan) in zip(keys, fresh):
                    self._predictions[key] = (now, plan)
        moved = 0
        for m, job, current, task in waiting:
            cached = self._predictions.get(_task_key(job))
            if cached is None:
                continue
            plan = cached[1]
            here = _candidate_at(plan, current)
            here_start = current.expected_start or (here.predicted_start if here else None)
            # Places that can start it now are the first rule's, with this tick's capacity count.
            alternatives = [c for c in plan.feasible() if c.predicted_start is not None and not c.startable_now
                            and c.cluster not in avoid
                            and (c.cluster, c.partition) != (current.cluster, current.partition)]
            if here_start is None or not alternatives:
                continue
            best = min(alternatives, key=lambda c: c.predicted_start or math.inf)
            gain = here_start - (best.predicted_start or math.inf)
            if gain < self.settings.margin(here_start, now):
                continue
            why = (f"re-routed to {best.infra}: predicted to start there at {_clock(best.predicted_start)}, "
                   f"{_duration(gain)} sooner than on {current.cluster} ({_clock(here_start)}, "
                   f"{current.reason or 'pending'})")
            if await self._move(m, job, current, task, best, attempts, why):
                moved += 1
                # One move per task per prediction: the next one sees the moved job in its new queue.
                self._predictions.pop(_task_key(job), None)
        return moved

    async def _move(self, m: ManagedJobRow, job: JobRow, current: AttemptRow, task: Task, target: Candidate,
                    attempts: dict[str, list[AttemptRow]], why: str) -> int:
        """Submit the new attempt first; cancel the old one only once the new one is accepted."""
        if self.shards.lapsing():
            return 0
        number = max(a.number for a in attempts.get(job.id, [current])) + 1
        # Held where the infra can hold it: it keeps its place in the queue, and starts only once the
        # old attempt is known not to run (a kill lost while Slurm launched it must not make two runs).
        held = isinstance(self.client.infra(target.cluster, job.owner), ReleasesHeld)
        options = dataclasses.replace(_attempt_options(task, number), held=held)
        try:
            await self.launcher.submit_jobs(task, _environment(job, task), [target], [job], options)
        except CorralError as exc:
            self.store.set_managed(job.id, reason=f"could not move to {target.infra}: {exc}")
            return 0
        # Recorded before the cancel's round trip: nobody sees the new attempt without the move.
        self.store.set_managed(job.id, "PENDING", why, moves=m.moves + 1, last_move_at=time.time())
        # The old attempt stays CANCELLING until Slurm says it ended: a kill lost while Slurm was
        # launching it must not let it run unwatched (it is cancelled again each tick meanwhile).
        self.store.update_attempt(current.token, state="CANCELLING", reason=why)
        await self._cancel([current], settle=False)
        return 1

    async def _release(self, attempts: list[AttemptRow]) -> None:
        """Let held attempts start (one round trip per cluster and owner); a cluster that does not answer is
        asked again next tick."""
        for (cluster, owner), group in sent_by_account(self.store, attempts).items():
            try:
                infra = self.client.infra(cluster, owner)
                if not isinstance(infra, ReleasesHeld):
                    continue
                await infra.release_held([handle for _, handle in group])
            except CorralError:
                continue
            self.store.update_attempts({a.token: {"held": False} for a, _ in group})

    async def _setup_failed(self, attempt: AttemptRow) -> bool:
        """Did the attempt fail in `setup`? (one round trip, only on failure, where the infra can tell)"""
        owner = self.store.owners([attempt.job_id]).get(attempt.job_id, "")
        try:
            infra = self.client.infra(attempt.cluster, owner)
        except CorralError:
            return False
        return isinstance(infra, ReportsSetupFailure) and await infra.setup_failed(attempt.run_dir)

    async def _cancel(self, attempts: list[AttemptRow], settle: bool = True) -> int:
        """scancel the attempts (one round trip per cluster and owner); with `settle`, record them CANCELLED at once.
        Returns how many were sent; those on a cluster that did not answer stay as they are."""
        failed: set[str] = set()
        for (cluster, owner), group in sent_by_account(self.store, attempts).items():
            try:
                await self.client.infra(cluster, owner).cancel([handle for _, handle in group],
                                                               [a.run_dir for a, _ in group])
            except CorralError:
                failed.add(cluster)  # unreachable: stays CANCELLING, retried next tick
        done = [a for a in attempts if a.cluster not in failed]
        for a in done if settle else []:
            if a.state not in TERMINAL_STATES:
                self.store.update_attempt(a.token, state="CANCELLED", ended_at=time.time(),
                                          reason=a.reason or "cancelled by Corral")
        return len(done)

    def _where(self, cluster: str, partition: str) -> str:
        """slurm/<cluster>/<partition>, ssh/<pool> or k8s/<context>."""
        from corral.views import infra_name

        try:
            kind = self.client.registry.infra_kind(cluster)
        except CorralError:
            kind = "slurm"
        return infra_name(kind, cluster, partition)

    # ---- cluster health -------------------------------------------------------------------------
    def _track_reachability(self, errors: dict[str, str], now: float) -> None:
        health = self.store.health()
        for cluster in self.client.registry.names():
            row = health.get(cluster)
            if cluster in errors:
                if row is None or row.unreachable_since is None:
                    self.store.set_health(cluster, unreachable_since=now)
            elif row is not None and row.unreachable_since is not None:
                self.store.set_health(cluster, unreachable_since=None)

    def _unreachable_beyond_grace(self, now: float) -> set[str]:
        return {c for c, row in self.store.health().items()
                if row.unreachable_since is not None and now - row.unreachable_since > self.settings.grace_seconds}

    def _write_health_resets(self) -> None:
        """A job running on a cluster resets its count of failures in a row: one write per cluster
        and tick (and none when the count is already 0), not one per running job."""
        resets, self._health_resets = self._health_resets, set()
        health = self.store.health() if resets else {}
        for cluster in resets:
            if cluster in health and health[cluster].failures:
                self.store.set_health(cluster, failures=0)

    def _note_failure(self, cluster: str, now: float) -> None:
        if cluster in self._health_resets:  # a running job came first in this tick: its reset first
            self._health_resets.discard(cluster)
            self.store.set_health(cluster, failures=0)
        row = self.store.health().get(cluster)
        failures = (row.failures if row else 0) + 1
        until = now + self.settings.unhealthy_seconds if failures >= self.settings.unhealthy_after_failures else 0.0
        self.store.set_health(cluster, failures=failures, unhealthy_until=until or (row.unhealthy_until if row else 0))

    def _unhealthy(self, now: float) -> set[str]:
        return {c for c, row in self.store.health().items() if row.unhealthy_until > now}


def _task(job: JobRow) -> Task:
    return _parse_task(job.task_json)


def _environment(job: JobRow, task: Task) -> dict[str, str]:
    """The job's envs, and its secrets unsealed from the store (a sweep's jobs share both)."""
    return {**resolved_envs(task, "managed job"), **unseal(job.secrets_sealed)}


@functools.lru_cache(maxsize=256)
def _parse_task(task_json: str) -> Task:
    """Validated once per distinct task, not once per job and tick: a sweep's jobs share their task
    (tasks are read, never changed, by the controller)."""
    return Task.model_validate(json.loads(task_json))


def _checkpoint_dir(job: JobRow, task: Task) -> str:
    if task.checkpoint and task.checkpoint.path:
        return task.checkpoint.path
    return f"{CHECKPOINTS_DIR}/{job.id}"


def _attempt_options(task: Task, number: int) -> AttemptOptions:
    """Managed attempts: CORRAL_ATTEMPT, CORRAL_CHECKPOINT_DIR, and no requeue by the infra (Corral recovers)."""
    path = task.checkpoint.path if task.checkpoint and task.checkpoint.path else DEFAULT_CHECKPOINT_DIR
    return AttemptOptions(first_number=number, extra_env={"CORRAL_ATTEMPT": str(number)}, requeue=False,
                          checkpoint_dir=path)


def _batches(to_place: list[tuple[JobRow, str]],
             attempts: dict[str, list[AttemptRow]]) -> list[tuple[int, list[JobRow]]]:
    """Jobs of one task with the same next attempt number and contiguous ranks: one array each."""
    out: list[tuple[int, list[JobRow]]] = []
    for job, _why in sorted(to_place, key=lambda p: (_task_key(p[0]), p[0].sweep_id or p[0].id, p[0].job_rank)):
        number = max((a.number for a in attempts.get(job.id, [])), default=0) + 1
        last = out[-1][1][-1] if out else None
        if out and last and out[-1][0] == number and _task_key(last) == _task_key(job) \
                and last.sweep_id == job.sweep_id and last.job_rank + 1 == job.job_rank \
                and _last_cluster(attempts, last) == _last_cluster(attempts, job):
            out[-1][1].append(job)
        else:
            out.append((number, [job]))
    return out


def _last_cluster(attempts: dict[str, list[AttemptRow]], job: JobRow) -> str | None:
    """Where the job's last attempt ran (a batch shares it: recovery strategies order by it)."""
    mine = attempts.get(job.id)
    return mine[-1].cluster if mine else None


def after_taken(feasible: list[Candidate], taken: dict[tuple[str, str], int]) -> list[Candidate]:
    """The ranked candidates with what this tick already placed taken off what each can start now;
    those that can still start a copy now first, each group in its rank order."""
    adjusted = []
    for candidate in feasible:
        used = taken.get((candidate.cluster, candidate.partition), 0)
        if used:
            left = max(0, candidate.startable_copies - used)
            candidate = dataclasses.replace(candidate, startable_copies=left,
                                            startable_now=candidate.startable_now and left > 0)
        adjusted.append(candidate)
    return sorted(adjusted, key=lambda c: not c.startable_now)


def recovery_order(feasible: list[Candidate], strategy: RecoveryStrategy | None,
                   previous: str | None) -> list[Candidate]:
    """Where a recovered attempt goes (SkyPilot's strategies): FAILOVER tries the cluster the job was on
    first, EAGER_NEXT_REGION tries it last; unset, placement's ranking (soonest start) decides alone."""
    if previous is None or strategy not in (RecoveryStrategy.FAILOVER, RecoveryStrategy.EAGER_NEXT_REGION):
        return feasible
    same = [c for c in feasible if c.cluster == previous]
    others = [c for c in feasible if c.cluster != previous]
    return same + others if strategy is RecoveryStrategy.FAILOVER else others + same


def _task_key(job: JobRow) -> tuple[str, str]:
    """Jobs plan, predict and batch together only with the same owner's same task."""
    return job.owner, job.task_json


def _infra_failure(attempt: AttemptRow) -> bool:
    return attempt.state == "FAILED" and attempt.failure == FailureClass.INFRA


QUICK_FAILURE_SECONDS = 60.0  # an attempt the infrastructure ended this soon after it started never really ran


def launch_failures_in_a_row(attempts: list[AttemptRow]) -> int:
    """How many of a job's latest attempts (oldest first in `attempts`) the infrastructure ended before
    or within QUICK_FAILURE_SECONDS of their start: a job Slurm fails to launch wherever it goes, not one
    a cluster lost while it ran. Submissions that reached no cluster neither count nor end the run."""
    count = 0
    for attempt in reversed(attempts):
        if attempt.state == "SUBMIT_FAILED":
            continue
        ran = (attempt.ended_at or 0.0) - (attempt.started_at or attempt.ended_at or 0.0)
        if not _infra_failure(attempt) or ran > QUICK_FAILURE_SECONDS:
            break
        count += 1
    return count


def _reasons(plan: Plan) -> str:
    return "; ".join(f"{c.infra}: {c.reason}" for c in plan.ranked()[:4] if c.reason) or "none feasible"


def _candidate_at(plan: Plan, attempt: AttemptRow) -> Candidate | None:
    return next((c for c in plan.candidates if (c.cluster, c.partition) == (attempt.cluster, attempt.partition)), None)


def _clock(epoch: float | None) -> str:
    return time.strftime("%H:%M", time.localtime(epoch)) if epoch else "unknown"


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes} min"
