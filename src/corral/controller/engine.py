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

Submissions (placements and moves, checkpoint copies included) run beside the ticks: a tick waits for
them `submit_wait` seconds at most, and a slower one (a large checkpoint or workdir) goes on while later
ticks track every other job. Its jobs are left out of those ticks until it ends, and the clusters whose
holder drives them (their homes) stay this replica's meanwhile, so that no other replica places them again.

What happens to each managed job is decided by the rules (rules.py), from its rows alone; this module
fetches what they need, carries out their decisions, and does what spans jobs:
- placing: a new attempt on the best cluster (unhealthy clusters avoided), with the latest checkpoint
  copied over if it moves; FAILOVER tries the same cluster first and EAGER_NEXT_REGION another one
  first (`recovery_order`), where unset the soonest start decides;
- re-routing: pending while another cluster can start it now and its own cannot, or (when none can)
  while another cluster is predicted to start it sooner by a clear margin: submit there first, held,
  cancel the old attempt only once the new one is accepted, and release the new one only once Slurm
  says the old one ended without succeeding (hysteresis: pending for `reroute_after` seconds, not
  moved within `reroute_cooldown`, and for predictions the margin; see `_reroute_by_prediction`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import tempfile
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral import budget
from corral.client import Client
from corral.controller import rules
from corral.controller.background import run_on
from corral.controller.rules import Context, ControllerSettings, Decision, Facts, Need
from corral.controller.shards import Shards, home_cluster
from corral.dev import settle_unfollowed_execs, start_queued_execs
from corral.errors import ClusterError, CorralError
from corral.infra.base import (
    DEFAULT_CHECKPOINT_DIR,
    CopiesCheckpoints,
    Infra,
    JobState,
    ReleasesHeld,
    ReportsSetupFailure,
    new_token,
)
from corral.launch import (
    AttemptOptions,
    CarriedFolder,
    Launcher,
    LaunchEvents,
    not_set_up_reasons,
    recorded_environment,
    split_sweep,
)
from corral.placement import Candidate, Plan
from corral.state import Store
from corral.state.models import AttemptRow, JobRow, ManagedJobRow, ManagedState
from corral.state.store import TERMINAL_STATES
from corral.task import Task
from corral.tracker import (
    RefreshScope,
    SharedRefresh,
    Tracker,
    left_out,
    sent_by_account,
)

LEASE = "controller"
# While execs run that no server follows (theirs stopped while they ran), their allocations are asked
# this often for the ones that ended: one status query per cluster, by the chores' holder.
EXEC_SETTLE_SECONDS = 30.0
CHECKPOINTS_DIR = ".corral/checkpoints"


@dataclass
class TickReport:
    drove: bool  # held any cluster (or the chores lease): did anything
    chores: bool = False  # held the chores lease (usage samples, settling interrupted launches)
    clusters: list[str] = field(default_factory=list)  # the clusters this replica held and drove
    replicas: int = 1  # live replicas on the store, this one included
    jobs: int = 0  # live managed jobs this replica drove
    queued_execs: int = 0  # execs still waiting for their allocation to be ready (the chores' holder)
    submitted: int = 0  # jobs whose new attempt was accepted since the last report (late submissions included)
    moved: int = 0
    submitting: int = 0  # jobs whose submission still runs beside the ticks (longer than `submit_wait`)
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
        self._execs_settled = -math.inf  # time.monotonic() when unfollowed execs were last looked for
        self._submitting: dict[str, Submitting] = {}  # job id -> its submission running beside the ticks
        self._ended: Counter[str] = Counter()  # "submitted", "moved": jobs whose submission ended, not yet reported
        self._failures: list[BaseException] = []  # of submissions that raised, not yet reported

    async def tick(self) -> TickReport:
        held = self.shards.claim(keep=self.submitting_homes())
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
        # Never this controller's own previous refresh; one the API made since the last tick will do. A
        # cluster slow to answer holds up the others' jobs for `status_wait` at most: its jobs are decided
        # as last seen, and its answer is written when it comes.
        refresh = await self.refreshes.refresh(Tracker(self.client, self.store), newer_than=self._last_tick,
                                               at_most=self.settings.status_wait)
        report.errors = dict(refresh.errors)
        now = time.time()
        # A cluster still being asked, whose last answer was fine, is slow rather than gone: its grace
        # clock neither starts nor stops (one whose last answer failed is in `errors` alone).
        self._track_reachability(refresh.errors, set(refresh.deferred) | set(refresh.waiting), now)
        managed = self.store.managed(live_only=True)
        # Before this tick's decisions: what they mark CANCELLING now is cancelled by them.
        cancelling = self.store.attempts_in_state(JobState.CANCELLING) if held else []
        sent: set[str] = set()
        if managed:
            # Attempts of every live managed job in one query; the jobs themselves (their task, sealed
            # secrets) only for the few this tick places, moves or judges: memory stays flat with 10,000.
            attempts = self.store.attempts_of_live_managed()
            configured = self.client.registry.names()
            # A job whose submission still runs waits for it (and a job group for all of its tasks').
            groups = {m.group_id for m in managed if m.group_id and m.job_id in self._submitting}
            managed = [m for m in managed if self._drives(m, attempts, configured, held, chores)
                       and m.job_id not in self._submitting and not (m.group_id and m.group_id in groups)]
            report.jobs = len(managed)
            if managed:
                # A cluster whose status query has not answered is left out of this tick's placement (a
                # job that names it excepted): its probe, and a submission, would most likely wait too.
                sent = await self._drive(managed, attempts, held, now, report, left_out(refresh.asking))
        await self._cancel_again(cancelling, held, set(refresh.errors) | self._unreachable_beyond_grace(now), sent)
        await self._wait_for_submissions(self.settings.submit_wait)
        if chores:  # execs queued in allocations that were not ready: started once they are
            report.queued_execs = await start_queued_execs(self.client, self.store, run_on)
        if chores and time.monotonic() - self._execs_settled >= EXEC_SETTLE_SECONDS:
            self._execs_settled = time.monotonic()
            await settle_unfollowed_execs(self.client, self.store)
        report.round_trips = {c: n - before.get(c, 0) for c, n in self.client.transport.round_trips.items()
                              if n - before.get(c, 0)}
        report.submitted, report.moved = self._ended.pop("submitted", 0), self._ended.pop("moved", 0)
        report.submitting = len(self._submitting)
        self._last_tick = time.monotonic()
        return report

    # ---- submissions beside the ticks -----------------------------------------------------------
    def _detach(self, homes: dict[str, str | None], kind: str, work: Coroutine[Any, Any, int]) -> None:
        """Run one submission (`kind`: "submitted" for a placement, "moved" for a move) beside the ticks.
        `homes`: its jobs -> their home cluster, kept leased until it ends (`submitting_homes`)."""
        async def counted() -> int:
            count = await work
            self._ended[kind] += count
            return count

        submission = asyncio.ensure_future(counted())
        for job_id, home in homes.items():
            self._submitting[job_id] = Submitting(submission, home)
        submission.add_done_callback(functools.partial(self._submission_ended, list(homes)))

    def _submission_ended(self, job_ids: list[str], submission: asyncio.Future[int]) -> None:
        for job_id in job_ids:
            if job_id in self._submitting and self._submitting[job_id].future is submission:
                del self._submitting[job_id]
        if not submission.cancelled() and (failure := submission.exception()) is not None:
            self._failures.append(failure)

    async def _wait_for_submissions(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the submissions running beside the ticks. One that failed in
        a way Corral does not handle (a bug, not a cluster's refusal) fails the tick that sees it end, as
        it would have failed the tick that ran it (the server's log says so)."""
        running = {s.future for s in self._submitting.values()}
        if running:
            await asyncio.wait(running, timeout=timeout)
        if self._failures:
            failure, self._failures = self._failures[0], []
            raise failure

    def submitting_homes(self) -> set[str]:
        """The home clusters of the jobs whose submission still runs: this replica keeps them."""
        return {s.home for s in self._submitting.values() if s.home is not None}

    async def finish_submissions(self, timeout: float) -> set[str]:
        """For a stopping server: wait up to `timeout` seconds for the submissions still running; returns
        the home clusters of those that did not end (their leases are left to lapse, not given up)."""
        try:
            await self._wait_for_submissions(timeout)
        except Exception:  # noqa: BLE001 - stopping: a failed submission's job is placed again by whoever drives it
            pass
        return self.submitting_homes()

    # ---- one tick over all managed jobs ---------------------------------------------------------
    @staticmethod
    def _drives(m: ManagedJobRow, attempts: dict[str, list[AttemptRow]], configured: list[str], held: set[str],
                chores: bool) -> bool:
        """Is this replica the one that drives the job: does it hold the job's home cluster (shards.py)?"""
        home = _home(m, attempts, configured)
        return home in held if home is not None else chores

    async def _drive(self, managed: list[ManagedJobRow], attempts: dict[str, list[AttemptRow]], held: set[str],
                     now: float, report: TickReport, slow: dict[str, str]) -> set[str]:
        """Decide for each job (rules.py) and carry the decisions out; returns the attempts it cancelled.
        `slow`: clusters not asked for placement, with why."""
        unreachable = self._unreachable_beyond_grace(now)
        to_place: list[tuple[str, str]] = []  # (job id, why)
        pending: list[tuple[ManagedJobRow, str, AttemptRow]] = []
        to_cancel: list[AttemptRow] = []
        to_release: list[AttemptRow] = []
        reasons: dict[str, str] = {}  # why each attempt is cancelled, as the rules marked it
        live = {m.job_id: m for m in managed}  # the rows this tick's decisions change as they go
        context = Context(now, frozenset(unreachable), self.settings, self._where,
                          *self._pipeline_rows(live, attempts))
        # A pipeline's tasks in the order they run: a task whose predecessor ends this tick starts on it;
        # a job group's auxiliary tasks after its primary ones, so they see a primary that ends this tick.
        for m in sorted(managed, key=lambda m: (m.auxiliary, m.pipeline_stage or 0)):
            mine = attempts.get(m.job_id, [])
            decision = await self._decide(m, mine, context)
            for token, fields in decision.mark.items():
                self.store.update_attempt(token, **fields)
                if isinstance(fields.get("reason"), str):
                    reasons[token] = fields["reason"]
            if decision.note:
                self._changes.append((m.job_id, None, decision.note, {}))
            if decision.failed_on:
                self._note_failure(decision.failed_on, now)
            if decision.state is not None:
                self._set(m, decision.state, decision.reason, **decision.fields)
            if decision.running_on:
                self._health_resets.add(decision.running_on)  # written once per cluster, below
            to_cancel += decision.cancel
            if decision.place:
                to_place.append((m.job_id, decision.place))
            if decision.may_move is not None:
                pending.append((m, m.job_id, decision.may_move))
            if decision.release is not None:
                to_release.append(decision.release)
        self._write_changes()
        self._write_health_resets()
        report.cancelled += await self._cancel(to_cancel, reasons=reasons)
        await self._release(to_release)
        sent = {a.token for a in to_cancel}
        if not to_place and not pending:
            return sent
        rows = self.store.jobs([job for job, _ in to_place] + [job for _, job, _ in pending])
        placing = [(rows[job], why) for job, why in to_place]
        moving = [(m, rows[job], latest) for m, job, latest in pending]
        outcomes = await self.launcher.probe_for([_task(job) for job, _ in placing] +
                                                 [_task(job) for _, job, _ in moving], slow)
        await self._place(placing, attempts, outcomes, unreachable, now, live)
        await self._reroute(moving, attempts, outcomes, unreachable, now)
        return sent

    def _pipeline_rows(self, live: dict[str, ManagedJobRow], attempts: dict[str, list[AttemptRow]]
                       ) -> tuple[dict[str, ManagedJobRow], dict[str, tuple[ManagedJobRow, ...]]]:
        """For each pipeline task waiting for the one before it (no attempt yet), that task's row; for
        each live auxiliary task of a job group, its group's primary tasks' rows (`live`'s own where this
        replica drives them): one store read for all of them, none when no such task is live."""
        waiting = [m for m in live.values()
                   if m.pipeline_stage and not m.pipeline_parallel and not attempts.get(m.job_id)]
        auxiliary = [m for m in live.values() if m.auxiliary]
        tasks = self.store.pipeline_tasks(str(m.pipeline_id) for m in waiting + auxiliary)
        stages = {(p, t.pipeline_stage): live.get(t.job_id, t) for p, rows in tasks.items() for t in rows}
        before = {m.job_id: stages[(m.pipeline_id, m.pipeline_stage - 1)] for m in waiting
                  if (m.pipeline_id, m.pipeline_stage - 1) in stages}
        primaries = {m.job_id: tuple(live.get(t.job_id, t) for t in tasks.get(str(m.pipeline_id), [])
                                     if not t.auxiliary) for m in auxiliary}
        return before, primaries

    async def _decide(self, m: ManagedJobRow, attempts: list[AttemptRow], context: Context) -> Decision:
        """The rules' decision for one job, with the facts they ask for fetched (each at most once)."""
        facts = Facts()
        while (decision := rules.decide(m, attempts, context, facts)).needs is not None:
            need = decision.needs
            if need in facts.known:
                raise RuntimeError(f"the rules asked twice for {need.value} (job {m.job_id})")
            if need is Need.RECOVERY:
                recovery = _task(self.store.jobs([m.job_id])[m.job_id]).resources.job_recovery
                facts = dataclasses.replace(facts, known=facts.known | {need}, recovery=recovery)
            else:
                setup_failed = await self._setup_failed(attempts[-1])
                facts = dataclasses.replace(facts, known=facts.known | {need}, setup_failed=setup_failed)
        return decision

    def _set(self, m: ManagedJobRow, state: ManagedState, reason: str | None, **fields: object) -> None:
        """Note a change of a managed job, written with the others in one transaction (`_write_changes`);
        only when something changed: a quiet tick writes nothing."""
        if (state, reason) == (m.state, m.reason) and all(getattr(m, k) == v for k, v in fields.items()):
            return
        self._changes.append((m.job_id, state, reason, fields))
        m.state, m.reason, m.updated_at = state, reason, time.time()
        for key, value in fields.items():
            setattr(m, key, value)

    def _write_changes(self) -> None:
        changes, self._changes = self._changes, []
        self.store.set_managed_many(changes)

    # ---- placing new attempts -------------------------------------------------------------------
    async def _place(self, to_place: list[tuple[JobRow, str]], attempts: dict[str, list[AttemptRow]],
                     outcomes: list, unreachable: set[str], now: float, rows: dict[str, ManagedJobRow]) -> None:
        """Decide where every batch goes, one after the other on this tick's probe, each seeing what the
        ones before took of each place's free capacity; then start all their submissions at once, beside
        the tick (the transport and the budget bound the sessions per cluster)."""
        avoid = unreachable | self._unhealthy(now)
        taken: dict[tuple[str, str], int] = {}  # copies placed on each place this tick
        decided: list[tuple[int, list[JobRow], Task, list[Candidate]]] = []
        planned: list[tuple[int, list[JobRow], Task, Plan, list[Candidate]]] = []
        for number, jobs in _batches(to_place, attempts):
            if self.shards.lapsing():  # the rest wait for the next tick, under renewed leases
                break
            task = _task(jobs[0])
            plan = await self.launcher.plan(task, predict="when_full", outcomes=outcomes, owner=jobs[0].owner,
                                            grouped=_group_of(rows, jobs[0].id) is not None)
            planned.append((number, jobs, task, plan,
                            [c for c in plan.feasible() if c.cluster not in avoid] or plan.feasible()))
        groups = _group_places(planned, attempts, rows, unreachable)
        self._note_rounds(groups, planned, rows)
        for number, jobs, task, plan, feasible in planned:
            group = _group_of(rows, jobs[0].id)
            if group is not None:  # a job group's tasks run on one cluster, where they can reach each other
                feasible = [c for c in feasible if c.cluster == groups[group].cluster]
            before = attempts.get(jobs[0].id, [])
            recovery = task.resources.job_recovery
            feasible = rules.recovery_order(rules.after_taken(feasible, taken), recovery.strategy if recovery else None,
                                      before[-1].cluster if before else None)
            if not feasible:
                why = "no cluster can run it now: " + _reasons(plan)
                if group is not None and groups[group].cluster:
                    why = f"its job group runs on {groups[group].cluster}, which cannot run it now: " + _reasons(plan)
                elif group is not None:
                    why = "no cluster can run every task of its job group now: " + "; ".join(
                        f"{other[0].name}: {_reasons(its_plan)}" for _, other, _, its_plan, _ in planned
                        if _group_of(rows, other[0].id) == group)
                self.store.set_managed_many([(job.id, ManagedState.PENDING, why, {}) for job in jobs])
                continue
            for candidate, _first, count in split_sweep(feasible, len(jobs)):
                key = (candidate.cluster, candidate.partition)
                taken[key] = taken.get(key, 0) + count
            decided.append((number, jobs, task, feasible))
        configured = self.client.registry.names()
        for number, jobs, task, feasible in decided:
            homes = {job.id: _home(rows[job.id], attempts, configured) if job.id in rows else None for job in jobs}
            # Only its jobs' latest attempts and row go along: a slow submission keeps no tick's reads alive.
            latest = {job.id: mine[-1] if (mine := attempts.get(job.id)) else None for job in jobs}
            self._detach(homes, "submitted",
                         self._submit_batch(number, jobs, task, feasible, latest, rows.get(jobs[0].id)))

    def _note_rounds(self, groups: dict[str, GroupPlace],
                     planned: list[tuple[int, list[JobRow], Task, Plan, list[Candidate]]],
                     rows: dict[str, ManagedJobRow]) -> None:
        """Record each job group task's round before it is submitted (a recovery beside it joins the
        round its row names), and on this tick's copies, which its attempt's environment reads."""
        changes = []
        for _number, jobs, _task, _plan, _candidates in planned:
            m = rows.get(jobs[0].id)
            place = groups.get(m.group_id) if m is not None and m.group_id else None
            if m is not None and place is not None and place.cluster and place.round != m.group_round:
                m.group_round = place.round
                changes.append((m.job_id, None, None, {"group_round": place.round}))
        self.store.set_managed_many(changes)

    async def _submit_batch(self, number: int, jobs: list[JobRow], task: Task, feasible: list[Candidate],
                            latest: dict[str, AttemptRow | None], m: ManagedJobRow | None) -> int:
        """Submit attempt `number` of these jobs (`latest`: each one's latest attempt; `m`: the first
        job's managed row), each job's checkpoint sent with its attempt wherever it lands."""
        with tempfile.TemporaryDirectory(prefix="corral-ckpt-") as scratch:
            carried = {job.id: checkpoint for job in jobs
                       if (checkpoint := self._checkpoint(job, task, latest.get(job.id), feasible[0].cluster,
                                                          Path(scratch) / job.id)) is not None}
            options = dataclasses.replace(_attempt_options(task, number, m), carried=tuple(carried.values()))
            try:
                shares = await self.launcher.submit_jobs(task, recorded_environment(jobs[0], task, "managed job"),
                                                         feasible, jobs, options)
            except CorralError as exc:
                self.store.set_managed_many([(job.id, None, f"submission failed: {exc}", {}) for job in jobs])
                return 0
        landed = {job_id: share.cluster for share in shares for job_id in share.job_ids}
        self.store.note_managed({job_id: note for job_id, checkpoint in carried.items()
                                 if (note := checkpoint.outcome(landed.get(job_id, checkpoint.source)))})
        self.store.note_managed({
            job_id: f"attempt {number} submitted to {share.infra or self._where(share.cluster, share.partition)} "
                    f"as {share.handles[i]}"
            for share in shares for i, job_id in enumerate(share.job_ids)
        })
        return sum(len(share.job_ids) for share in shares)

    def _checkpoint(self, job: JobRow, task: Task, previous: AttemptRow | None, first_choice: str,
                    into: Path) -> CarriedCheckpoint | None:
        """The checkpoint of the job's previous attempt, to carry should its new one land elsewhere;
        None when there is none to carry, or the new one is to go where the previous ran (`first_choice`)."""
        if previous is None or previous.cluster == first_choice or (task.checkpoint and not task.checkpoint.sync):
            return None
        source = self.client.infra(previous.cluster, job.owner)
        if not isinstance(source, CopiesCheckpoints):
            self.store.set_managed(job.id, reason=f"checkpoint not copied: {source.name} cannot copy it out")
            return None
        return CarriedCheckpoint(job.id, source, previous.cluster, _checkpoint_dir(job, task), into)

    # ---- re-routing pending jobs ----------------------------------------------------------------
    async def _reroute(self, pending: list[tuple[ManagedJobRow, JobRow, AttemptRow]],
                       attempts: dict[str, list[AttemptRow]], outcomes: list, unreachable: set[str],
                       now: float) -> None:
        """Move pending jobs: to a cluster that can start them now; failing that, to one predicted to
        start them sooner by a clear margin. The moves run beside the tick (`_detach`)."""
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
            if rules.starts_where_it_is(current, plan):
                continue  # Slurm will start it where it is
            move = rules.move_to_start_now(current, plan, taken, avoid)
            if move is None:
                waiting.append((m, job, current, task))
                continue
            taken[move.place] = taken.get(move.place, 0) + 1
            self._detach({job.id: current.cluster}, "moved",
                         self._move(m, job, current, task, move.target, _next_number(attempts, job), move.why))
        if waiting:
            await self._reroute_by_prediction(waiting, plans, attempts, avoid, now)

    async def _reroute_by_prediction(self, waiting: list[tuple[ManagedJobRow, JobRow, AttemptRow, Task]],
                                     plans: dict[tuple[str, str], Plan], attempts: dict[str, list[AttemptRow]],
                                     avoid: set[str], now: float) -> None:
        """Nowhere can start them now: compare predicted starts. Predictions (`sbatch --test-only` on
        every candidate, one round trip per cluster for all tasks) are made per task at most every
        `predict_interval` seconds, for at most `max_predicted_tasks` tasks per tick. A job moves only
        when the best alternative beats its current start by `reroute_margin` seconds and by
        `reroute_margin_fraction` of its current wait, and only one job per task per prediction: the
        next prediction sees the job already moved (the prediction is dropped as the move starts: one that
        fails is predicted again)."""
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
        for m, job, current, task in waiting:
            cached = self._predictions.get(_task_key(job))
            if cached is None:
                continue
            move = rules.move_by_prediction(current, cached[1], avoid, self.settings, now)
            if move is not None:
                # One move per task per prediction: the next one sees the moved job in its new queue.
                self._predictions.pop(_task_key(job), None)
                self._detach({job.id: current.cluster}, "moved",
                             self._move(m, job, current, task, move.target, _next_number(attempts, job), move.why))

    async def _move(self, m: ManagedJobRow, job: JobRow, current: AttemptRow, task: Task, target: Candidate,
                    number: int, why: str) -> int:
        """Submit the new attempt (`number`) first; cancel the old one only once the new one is accepted."""
        if self.shards.lapsing():
            return 0
        # Held where the infra can hold it: it keeps its place in the queue, and starts only once the
        # old attempt is known not to run (a kill lost while Slurm launched it must not make two runs).
        held = isinstance(self.client.infra(target.cluster, job.owner), ReleasesHeld)
        options = dataclasses.replace(_attempt_options(task, number, m), held=held)
        try:
            await self.launcher.submit_jobs(task, recorded_environment(job, task, "managed job"), [target], [job], options)
        except CorralError as exc:
            self.store.set_managed(job.id, reason=f"could not move to {target.infra}: {exc}")
            return 0
        # Recorded before the cancel's round trip: nobody sees the new attempt without the move.
        self.store.set_managed(job.id, ManagedState.PENDING, why, moves=m.moves + 1, last_move_at=time.time())
        # The old attempt stays CANCELLING until Slurm says it ended: a kill lost while Slurm was
        # launching it must not let it run unwatched (it is cancelled again each tick meanwhile).
        self.store.update_attempt(current.token, state=JobState.CANCELLING, reason=why)
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

    async def _cancel_again(self, cancelling: list[AttemptRow], held: set[str], unreachable: set[str],
                            sent: set[str]) -> None:
        """Cancel again what Corral decided must not run and no cluster has yet confirmed ended: the
        CANCELLING attempts on clusters this replica holds that answer now, whether their job is live or
        has ended since (recovered elsewhere while their cluster was down, or cancelled by its user).
        They stay CANCELLING: the tracker settles each from the cluster's own answer, so an attempt whose
        kill was lost is seen running (and cancelled again) or seen to have succeeded."""
        again = [a for a in cancelling if a.cluster in held and a.cluster not in unreachable and a.token not in sent]
        if again:
            await self._cancel(again, settle=False)

    async def _cancel(self, attempts: list[AttemptRow], settle: bool = True,
                      reasons: dict[str, str] | None = None) -> int:
        """scancel the attempts (one round trip per cluster and owner); with `settle`, record them CANCELLED at
        once, each with its reason in `reasons` (else its own). Returns how many were sent; those on a
        cluster that did not answer stay as they are (CANCELLING where the rules marked them: sent again)."""
        reasons = reasons or {}
        failed: set[str] = set()
        for (cluster, owner), group in sent_by_account(self.store, attempts).items():
            try:
                await self.client.infra(cluster, owner).cancel([handle for _, handle in group],
                                                               [a.run_dir for a, _ in group])
            except CorralError:
                failed.add(cluster)  # unreachable: stays CANCELLING, retried next tick
        done = [a for a in attempts if a.cluster not in failed]
        # One never accepted (its submission's answer lost) is not settled by a cancel that was not sent:
        # CANCELLING, the tracker finds it by its token (then it is cancelled again) or settles it as
        # never submitted (CANCELLED, with the reason it was cancelled for).
        for a in done if settle else []:
            if a.handle is None:
                continue
            if a.state not in TERMINAL_STATES:
                self.store.update_attempt(a.token, state=JobState.CANCELLED, ended_at=time.time(),
                                          reason=reasons.get(a.token) or a.reason or "cancelled by Corral")
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
    def _track_reachability(self, errors: dict[str, str], deferred: set[str], now: float) -> None:
        """When each cluster stopped answering. One not asked this tick (`deferred`: its budget or its
        controller's back-off) is as it was, not answering again."""
        health = self.store.health()
        for cluster in self.client.registry.names():
            row = health.get(cluster)
            if cluster in deferred:
                continue
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


@dataclass(frozen=True)
class Submitting:
    """A job's submission running beside the ticks."""

    future: asyncio.Future[int]
    home: str | None  # the cluster whose holder drives the job (None: the chores' holder does)


def _home(m: ManagedJobRow, attempts: dict[str, list[AttemptRow]], configured: list[str]) -> str | None:
    """The job's home cluster (shards.home_cluster). A job group's tasks share a home until placed (by
    the group's id), so that one replica places them together."""
    mine = attempts.get(m.job_id)
    key = m.group_id if m.group_id and not mine else m.job_id
    return home_cluster(key, mine[-1].cluster if mine else None, configured)


def _task(job: JobRow) -> Task:
    return _parse_task(job.task_json)


@functools.lru_cache(maxsize=256)
def _parse_task(task_json: str) -> Task:
    """Validated once per distinct task, not once per job and tick: a sweep's jobs share their task
    (tasks are read, never changed, by the controller)."""
    return Task.model_validate(json.loads(task_json))


class CarriedCheckpoint(CarriedFolder):
    """A job's checkpoint folder on the cluster it ran on (`source`), carried to each cluster a submission
    of its new attempt asks for: straight from one login node to the other where both can (send_dir:
    never through this machine's disk), else fetched once into `into` (a share that fails over uses
    that copy again) and uploaded; and the story of it for the job's events (`outcome`)."""

    def __init__(self, job_id: str, infra: CopiesCheckpoints, source: str, remote: str, into: Path) -> None:
        super().__init__(job_id, source, remote)
        self.infra, self.into = infra, into
        self._lock = asyncio.Lock()
        self._fetched: bool | None = None  # None: not asked yet
        self._carried: set[str] = set()  # the clusters it reached
        self._failure: str | None = None

    async def carry(self, target: Infra, place: str, token: str) -> None:
        if self._failure is not None or self._fetched is False:  # the source failed, or has none: go without
            return
        try:
            sent = await self.infra.send_dir(self.remote, target, self.remote + "/")
        except ClusterError as exc:
            if exc.cluster != self.source:
                raise  # the target's: the submission fails over
            self._failure = str(exc)
            return
        except CorralError as exc:
            self._failure = str(exc)
            return
        if sent is None:  # not between these two: through this machine
            if (local := await self._fetch()) is not None:
                await target.upload(local, self.remote + "/", token)
                self._carried.add(place)
        elif sent:
            self._carried.add(place)
        else:
            self._fetched = False  # there is none

    async def _fetch(self) -> Path | None:
        async with self._lock:
            if self._fetched is None:
                try:
                    self._fetched = await self.infra.fetch_dir(self.remote, self.into)
                except CorralError as exc:
                    self._fetched, self._failure = False, str(exc)
        return self.into if self._fetched else None

    def outcome(self, landed: str) -> str | None:
        """What happened to it, the job's new attempt having landed on `landed` (None: nothing to say)."""
        if self._failure is not None:
            return f"checkpoint not copied from {self.source}: {self._failure}"
        if landed in self._carried and landed != self.source:
            return f"checkpoint copied from {self.source} to {landed}"
        return None


def _checkpoint_dir(job: JobRow, task: Task) -> str:
    if task.checkpoint and task.checkpoint.path:
        return task.checkpoint.path
    return f"{CHECKPOINTS_DIR}/{job.id}"


def _attempt_options(task: Task, number: int, m: ManagedJobRow | None = None) -> AttemptOptions:
    """Managed attempts: CORRAL_ATTEMPT, CORRAL_CHECKPOINT_DIR, and no requeue by the infra (Corral recovers);
    a pipeline's task (`m`) also learns its pipeline: CORRAL_PIPELINE_ID (the same for all its tasks, one
    run's), CORRAL_PIPELINE_NAME and CORRAL_PIPELINE_TASK (its place, 0, 1, …); a job group's task, the
    group's name (CORRAL_JOBGROUP_NAME, and SkyPilot's SKYPILOT_JOBGROUP_NAME) and its own task name
    (CORRAL_JOBGROUP_TASK), by which the job's script publishes its nodes to the others."""
    path = task.checkpoint.path if task.checkpoint and task.checkpoint.path else DEFAULT_CHECKPOINT_DIR
    env = {"CORRAL_ATTEMPT": str(number)}
    if m is not None and m.pipeline_id:
        env |= {"CORRAL_PIPELINE_ID": m.pipeline_id, "CORRAL_PIPELINE_NAME": m.pipeline_name or "",
                "CORRAL_PIPELINE_TASK": str(m.pipeline_stage or 0)}
    if m is not None and m.pipeline_parallel:
        env |= {"CORRAL_JOBGROUP_NAME": m.pipeline_name or "", "SKYPILOT_JOBGROUP_NAME": m.pipeline_name or "",
                "CORRAL_JOBGROUP_TASK": task.name or f"task-{m.pipeline_stage or 0}",
                **({"CORRAL_JOBGROUP_ROUND": m.group_round} if m.group_round else {})}
    return AttemptOptions(first_number=number, extra_env=env, requeue=False, checkpoint_dir=path)


@dataclass(frozen=True)
class GroupPlace:
    """Where a job group's tasks placed this tick go, and the round they run in (models.group_round)."""

    cluster: str | None  # None: no cluster can run every task of it now
    round: str | None  # None only for tasks joining a round from before rounds were kept


def _group_places(planned: list[tuple[int, list[JobRow], Task, Plan, list[Candidate]]],
                  attempts: dict[str, list[AttemptRow]], rows: dict[str, ManagedJobRow],
                  unreachable: set[str]) -> dict[str, GroupPlace]:
    """Each job group placed this tick -> its place: where its other tasks still run, in their round
    (a task recovered after a node failure goes back to them), else the one cluster that can run
    every task of it soonest (rules.group_cluster) in a new round, so that a group whose cluster was
    lost moves whole and its tasks never read an earlier round's host files."""
    standing = {group: rows[job] for job, mine in attempts.items()
                if mine and mine[-1].state in rules.LIVE_ON_A_CLUSTER and mine[-1].cluster not in unreachable
                and (group := _group_of(rows, job))}
    clusters = {group: attempts[m.job_id][-1].cluster for group, m in standing.items()}
    feasible: dict[str, list[list[Candidate]]] = {}
    for _number, jobs, _task, _plan, candidates in planned:
        if (group := _group_of(rows, jobs[0].id)) is not None:
            feasible.setdefault(group, []).append(candidates)
    return {group: (GroupPlace(clusters[group], standing[group].group_round) if group in standing
                    else GroupPlace(rules.group_cluster(each), new_token()))
            for group, each in feasible.items()}


def _group_of(rows: dict[str, ManagedJobRow], job_id: str) -> str | None:
    """The id of the job group a managed job (driven this tick) is a task of; None for any other job."""
    m = rows.get(job_id)
    return m.group_id if m is not None else None


def _batches(to_place: list[tuple[JobRow, str]],
             attempts: dict[str, list[AttemptRow]]) -> list[tuple[int, list[JobRow]]]:
    """Jobs of one task with the same next attempt number and contiguous ranks: one array each."""
    out: list[tuple[int, list[JobRow]]] = []
    for job, _why in sorted(to_place, key=lambda p: (_task_key(p[0]), p[0].sweep_id or p[0].id, p[0].job_rank)):
        number = _next_number(attempts, job)
        last = out[-1][1][-1] if out else None
        if out and last and out[-1][0] == number and _task_key(last) == _task_key(job) \
                and last.sweep_id == job.sweep_id and last.job_rank + 1 == job.job_rank \
                and _last_cluster(attempts, last) == _last_cluster(attempts, job):
            out[-1][1].append(job)
        else:
            out.append((number, [job]))
    return out


def _next_number(attempts: dict[str, list[AttemptRow]], job: JobRow) -> int:
    """The number of the job's next attempt."""
    return max((a.number for a in attempts.get(job.id, [])), default=0) + 1


def _last_cluster(attempts: dict[str, list[AttemptRow]], job: JobRow) -> str | None:
    """Where the job's last attempt ran (a batch shares it: recovery strategies order by it)."""
    mine = attempts.get(job.id)
    return mine[-1].cluster if mine else None


def _task_key(job: JobRow) -> tuple[str, str]:
    """Jobs plan, predict and batch together only with the same owner's same task."""
    return job.owner, job.task_json


def _reasons(plan: Plan) -> str:
    """Why no place fits, on one line (a table's cell): the best four reasons, then each cluster not
    asked or not answering."""
    return "; ".join(plan.refusals()[:4] + plan.unanswered() + not_set_up_reasons(plan)) or "none feasible"
