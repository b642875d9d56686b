"""Keeping the state store in step with Slurm: refresh, cancel, logs.

A refresh costs one SSH round trip per cluster that has live jobs, whatever their number: one
`squeue --me` for all of the user's jobs (a team server: `squeue -u` for every member's, through the
service account; accounts.py), plus `sacct`, in the same script, for jobs squeue has forgotten on
sites with accounting. Jobs are matched to attempts by their Slurm job name
(`corral-<token>`), which is also how a submission interrupted before its id was recorded is found.
Where the site's squeue has `--only-job-state`, a refresh that needs only the tracked jobs (every
live attempt has its id, no submission is being watched for) asks that light query first, and the
full one runs only when a tracked job's state changed, or a minute after the last (infra/slurm).

The same answer catches orphans: a job Slurm runs under the token of an attempt Corral holds as
failed to submit (its submission got no answer, so the job went on elsewhere) or cancelled (a
cancel crossed a start) is cancelled, so that a lost answer never makes a job run twice. Clusters
where a submission got no answer in the last hour are queried for that, even with no live job there.

Replicas on one store refresh only the clusters they hold (`RefreshScope`, set by the controller; see
controller/shards.py): each cluster is queried by one of them, and the others read its states.

Under load a cluster whose RPC budget cannot afford the query at once is left as last seen, for up
to REFRESH_DEFER_SECONDS since its last refresh (the report says which were deferred).

Each cluster's query is its own flight (`Flights`): in the server, a cluster whose query is still
running when the next refresh starts (a slow or frozen `slurmctld`: squeue can take up to its 30 s
timeout) is joined, not asked again, while the others are asked afresh. Callers that wait only so
long (`SharedRefresh.refresh(at_most=)`: the API's requests and the controller's tick) get the
others' answers and carry on; the slow one's answer is written when it comes.
"""

from __future__ import annotations

import asyncio
import functools
import math
import operator
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from corral import budget
from corral.client import Client
from corral.errors import ClusterError, CorralError, NotFoundError, asked_again
from corral.infra.base import (
    LIVE_STATES,
    FailureClass,
    Infra,
    JobState,
    JobStatus,
    RunsArrays,
    holder,
)
from corral.infra.shell import EXEC_OUTPUT
from corral.liveness import SENDING, quiet_senders, tag_alive
from corral.state import Store
from corral.state.models import AttemptRow, RunDirState
from corral.state.store import TERMINAL_STATES, JobView

SUBMIT_GRACE_SECONDS = 120  # an attempt still SUBMITTING after this, and unknown to Slurm, never got there
UNSENT_WATCH_SECONDS = 86400  # how far back jobs recorded without any attempt are looked for
ORPHAN_WATCH_SECONDS = 3600  # how long a cluster where a submission failed is watched for orphans
# Under load, a cluster whose budget cannot afford a status query at once (its Infra's status_commands)
# is left as last seen, for at most this long since its last refresh: a `queue` answers at once, not
# after the slot. Past it, the refresh waits for the slot as any round trip does.
REFRESH_DEFER_SECONDS = 10.0
_LAST_REFRESHED: dict[str, float] = {}  # cluster -> time.monotonic() of its last refresh, this process


@dataclass(frozen=True)
class RefreshReport:
    errors: dict[str, str]  # cluster -> why it could not be refreshed
    round_trips: dict[str, int]
    reaped: dict[str, list[str]] = field(default_factory=dict)  # cluster -> Slurm ids of orphans cancelled
    # Clusters left as last seen, not asked: their budget was short, or their controller is backed off
    # (then in `errors` too, as not answering).
    deferred: list[str] = field(default_factory=list)
    # Clusters still being asked when the caller stopped waiting (`Tracker.so_far`), whose last answer was
    # not a failure: slow, not known to be down (in `errors` too, saying so). Their jobs are as last seen.
    waiting: list[str] = field(default_factory=list)
    # Every cluster still being asked then (the `waiting` ones and those failing), with how long its query
    # had run: the controller's tick leaves them out of its placement.
    asking: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterAnswer:
    """How one cluster's status query ended (its statuses are written to the store by then)."""

    error: str | None = None
    reaped: list[str] = field(default_factory=list)  # Slurm ids of orphans cancelled
    deferred: bool = False  # not asked: its budget was short, or its controller is backed off


class Flights:
    """Each cluster's status query while it runs, at most one per cluster, and each cluster's last answer.
    A refresh that finds a cluster's query running (one a caller stopped waiting for) joins it instead
    of asking that cluster again; the last answers say which clusters failed when last asked."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[asyncio.Future[ClusterAnswer], float]] = {}  # (query, started)
        self.last: dict[str, ClusterAnswer] = {}

    def ask(self, cluster: str, query: Callable[[], Coroutine[Any, Any, ClusterAnswer]]
            ) -> tuple[asyncio.Future[ClusterAnswer], float]:
        """The cluster's running query, or `query()` started now; and when it started (monotonic)."""
        if cluster in self._running:
            return self._running[cluster]
        running = asyncio.ensure_future(query())
        self._running[cluster] = (running, time.monotonic())

        def landed(future: asyncio.Future[ClusterAnswer]) -> None:
            if self._running.get(cluster, (None,))[0] is future:
                del self._running[cluster]
            if not future.cancelled() and future.exception() is None:
                self.last[cluster] = future.result()

        running.add_done_callback(landed)
        return self._running[cluster]

    def running(self) -> set[str]:
        return set(self._running)

    def failed(self, cluster: str) -> bool:
        """Did the cluster's last answer say it failed?"""
        last = self.last.get(cluster)
        return last is not None and last.error is not None

    def ages(self, clusters: Iterable[str] | None = None, *, at_least: float = 0.0) -> dict[str, float]:
        """Seconds, to a tenth, each of these clusters' running query has run (0 if none runs); all
        clusters with a running query if `clusters` is None. Sorted by cluster. `at_least`: only those
        whose query has run that long, unrounded (as a caller's patience is compared)."""
        now = time.monotonic()
        ages = {}
        for cluster in sorted(self._running if clusters is None else clusters):
            elapsed = now - self._running[cluster][1] if cluster in self._running else 0.0
            if elapsed >= at_least:
                ages[cluster] = round(elapsed, 1)
        return ages

    def overdue(self, after: float) -> dict[str, float]:
        """The clusters whose running query has run `after` seconds or more, with how long."""
        return self.ages(at_least=after)


def left_out(ages: dict[str, float]) -> dict[str, str]:
    """Why placement leaves out each cluster whose status query has not answered (`ages`: how long it has
    run): its probe, and a submission there, would most likely wait as long (Client.probe's `leave_out`)."""
    return {c: f"its status query has had no answer in {age:g} s; left out of placement until it answers"
            for c, age in ages.items()}


@dataclass(frozen=True)
class RefreshScope:
    """What one replica of several refreshes: the clusters it holds, and (`chores`) the store-wide part
    (settling interrupted launches, reporting clusters no longer configured)."""

    clusters: frozenset[str]
    chores: bool


class Tracker:
    def __init__(self, client: Client, store: Store, flights: Flights | None = None):
        self.client = client
        self.store = store
        self.flights = flights if flights is not None else Flights()  # SharedRefresh's, in the server
        self.errors: dict[str, str] = {}  # of the refresh under way (or the last): cluster -> why it failed
        self.asking: set[str] = set()  # the clusters whose status query that refresh still waits for

    async def refresh(self, scope: RefreshScope | None = None, patience: float | None = None,
                      skip_failing: bool = False) -> RefreshReport:
        """Query every cluster with live jobs (or, with a scope, those of its clusters) and write what
        changed. With `patience` (seconds), a cluster whose query is already running and has run that
        long is not waited for, nor (`skip_failing`) one whose last query failed: each is asked all the
        same, and reported as `so_far` reports it."""
        if scope is None or scope.chores:
            self._settle_unsent()
        active = self.store.active_attempts()
        by_cluster: dict[str, list[AttemptRow]] = {}
        for attempt in active:
            by_cluster.setdefault(attempt.cluster, []).append(attempt)
        watched: set[str] = set()  # clusters where a failed submission may have left a job after all
        for attempt in self.store.failed_submissions(since=time.time() - ORPHAN_WATCH_SECONDS):
            if attempt.failure != FailureClass.REJECTED:  # the infra said no: it holds no copy to watch for
                by_cluster.setdefault(attempt.cluster, [])
                watched.add(attempt.cluster)
        known = set(self.client.registry.names())
        # Places that end what they declared failed (a pool's machine that stopped answering): watched as
        # well, for such a task found running once its machine answers again.
        declaring = [c for c in known if self.client.infra(c).ends_what_it_declared_failed]
        for cluster in self.store.clusters_with_infra_failures(declaring, since=time.time() - ORPHAN_WATCH_SECONDS):
            by_cluster.setdefault(cluster, [])
            watched.add(cluster)
        if scope is not None:  # clusters no longer configured are reported by the chores' holder
            by_cluster = {c: a for c, a in by_cluster.items()
                          if c in scope.clusters or (scope.chores and c not in known)}
        errors = self.errors = {}
        reaped: dict[str, list[str]] = {}
        deferred: list[str] = []
        overdue: set[str] = set()  # clusters whose query this refresh does not wait for (`patience`)
        before = dict(self.client.transport.round_trips)
        self.asking = set(by_cluster)
        # Read before any status query: a sender that finishes after it would have its job missed by it.
        unanswered = [a for a in active if a.handle is None]
        quiet = quiet_senders(a.submitter for a in unanswered)  # one scan of /proc for the whole refresh
        sending = SENDING.intersection(a.token for a in unanswered)

        async def one(cluster: str, attempts: list[AttemptRow]) -> None:
            flight, started = self.flights.ask(cluster, lambda: refresh_one(cluster, attempts))
            if patience is not None and not flight.done() and (
                    time.monotonic() - started >= patience or (skip_failing and self.flights.failed(cluster))):
                # Asked by an earlier refresh and still silent, or failing when last asked: not waited for.
                overdue.add(cluster)
                return
            try:
                # Shielded: a caller that stops waiting leaves the query to end and be written.
                answer = await asyncio.shield(flight)
            finally:
                self.asking.discard(cluster)
            if answer.error is not None:
                errors[cluster] = answer.error
            if answer.reaped:
                reaped[cluster] = answer.reaped
            if answer.deferred:
                deferred.append(cluster)

        async def refresh_one(cluster: str, attempts: list[AttemptRow]) -> ClusterAnswer:
            if cluster not in known:
                return ClusterAnswer(f"cluster {cluster!r} is no longer in {self.client.registry.path}")
            if time.monotonic() - _LAST_REFRESHED.get(cluster, -math.inf) < REFRESH_DEFER_SECONDS \
                    and not budget.affords_now(cluster, self.client.infra(cluster).status_commands):
                allowance = budget.budget_for(cluster)  # not answering: say so, each time
                return ClusterAnswer(allowance.why_short(0.0) if allowance.backing_off() else None, deferred=True)
            _LAST_REFRESHED[cluster] = time.monotonic()
            ids = [a.handle for a in attempts if a.handle]
            # Jobs not known by handle are found by token, among all the account's jobs.
            others = cluster in watched or len(ids) < len(attempts)
            try:
                # Everyone's jobs in one query through the service account, whoever submitted them.
                statuses = await self.client.infra(cluster).status(ids, self.client.cluster_users(cluster),
                                                                   others=others)
            except CorralError as exc:
                return ClusterAnswer(about(cluster, exc))
            by_token = by_attempt_token(statuses, self.client.infra(cluster))
            changes, settled = _updates(attempts, statuses, by_token, quiet, sending)
            self.store.update_attempts(changes)
            self.store.settle_unanswered(settled)
            try:
                cancelled = await self._reap(cluster, attempts, by_token)
            except CorralError as exc:
                return ClusterAnswer(f"could not cancel an orphaned job: {about(cluster, exc)}")
            return ClusterAnswer(reaped=cancelled)

        await asyncio.gather(*(one(c, a) for c, a in by_cluster.items()))
        trips = {c: n - before.get(c, 0) for c, n in self.client.transport.round_trips.items()
                 if n - before.get(c, 0)}
        ages = self.flights.ages(overdue)
        silent, waiting = self._unanswered(ages)
        return RefreshReport({**errors, **silent}, trips, reaped, sorted(deferred), waiting, ages)

    def so_far(self) -> RefreshReport:
        """The refresh under way as far as it has come, for a caller that stopped waiting: the clusters
        that answered are written to the store already; those it still waits for are reported, and
        their jobs are as last seen."""
        ages = self.flights.ages(self.asking)
        silent, waiting = self._unanswered(ages)
        return RefreshReport({**self.errors, **silent}, {}, waiting=waiting, asking=ages)

    def _unanswered(self, ages: dict[str, float]) -> tuple[dict[str, str], list[str]]:
        """Why each of these clusters, still being asked (`ages`: how long, Flights.ages), is not answered
        yet; and those of them that are only slow (`waiting`): one that failed when last asked is still
        failing."""
        silent: dict[str, str] = {}
        waiting: list[str] = []
        for cluster, age in ages.items():
            if self.flights.failed(cluster):
                silent[cluster] = asked_again(self.flights.last[cluster].error or "", age)
            else:
                silent[cluster] = f"no answer in {age:g} s; its jobs are shown as last seen (Corral keeps asking)"
                waiting.append(cluster)
        return silent, waiting

    def _settle_unsent(self) -> None:
        """Jobs recorded by a launch that died before giving them an attempt (kill -9 while a sweep
        was being recorded) become visible, failed, instead of staying invisible forever."""
        now = time.time()
        stranded = [job for job in self.store.jobs_without_attempts(since=now - UNSENT_WATCH_SECONDS)
                    if tag_alive(job.submitter) is False or now - job.created_at > SUBMIT_GRACE_SECONDS]
        if stranded:
            self.store.add_jobs([], [AttemptRow(
                token=f"unsent-{job.id}", job_id=job.id, number=1, cluster="", partition="",
                state=JobState.SUBMIT_FAILED, created_at=now, ended_at=now, run_dir="", log_path="",
                failure=FailureClass.REJECTED.value,
                reason="the command that launched it was interrupted before submitting it; nothing reached a "
                       "cluster (launch it again)") for job in stranded])

    async def _reap(self, cluster: str, attempts: list[AttemptRow], by_token: dict[str, JobStatus]) -> list[str]:
        """Cancel live jobs whose attempt Corral holds as ended by its own decision: a submission that
        failed or a cancel (or, where the infra ends what it declared failed, a failure it declared);
        returns their handles."""
        live = {token: s for token, s in by_token.items() if s.state in LIVE_STATES}
        for attempt in attempts:
            live.pop(attempt.token, None)
        if not live:
            return []
        # Only what Corral decided must not run; a FAILED job that Slurm requeued is Slurm's business.
        declared = self.client.infra(cluster).ends_what_it_declared_failed
        orphans = [a for a in self.store.attempts_by_token(list(live))
                   if a.state in (JobState.SUBMIT_FAILED, JobState.CANCELLED)
                   or (declared and a.state == JobState.FAILED and a.failure == FailureClass.INFRA)]
        if not orphans:
            return []  # in flight from another process, or not this store's job
        ids = [live[a.token].handle for a in orphans]
        for (_cluster, owner), group in sent_by_account(self.store, orphans, {a.token: live[a.token].handle
                                                                              for a in orphans}).items():
            await self.client.infra(cluster, owner).cancel([h for _, h in group], [a.run_dir for a, _ in group])
        self.store.update_attempts({
            a.token: {**({} if live[a.token].partial else {"handle": live[a.token].handle}),
                      "reason": f"{a.reason or a.state}; {cluster} had "
                                f"{'part of ' if live[a.token].partial else ''}the job after all, running on "
                                "its own: cancelled it there"}
            for a in orphans})
        return ids

    async def cancel(self, views: list[JobView]) -> list[JobView]:
        """Cancel live jobs (one scancel per cluster, as each job's owner); returns those that were live."""
        live = [v for v in views if v.attempt.state not in TERMINAL_STATES]
        by_account: dict[tuple[str, str], list[JobView]] = {}
        for view in live:
            by_account.setdefault((view.attempt.cluster, view.job.owner), []).append(view)

        async def one(account: tuple[str, str], group: list[JobView]) -> None:
            # An exec queued until its allocation is ready has reached no cluster: it ends here, unless
            # the server started it meanwhile (then it is cancelled as a running one).
            unsent = {v.attempt.token for v in group if v.job.allocation is not None and v.attempt.submitted_at is None
                      and self.store.move_attempt(v.attempt.token, JobState.PENDING, state=JobState.CANCELLED,
                                                  reason="cancelled by user", ended_at=time.time())}
            group = [v for v in group if v.attempt.token not in unsent]
            if not group:
                return
            infra = self.client.infra(*account)
            sent = [v.attempt for v in group if v.attempt.handle and v.job.allocation is None]
            # An exec's handle is its allocation's holder: end the exec alone, never the allocation. It is
            # marked first, as the server running it sees its session end and must know why.
            execs = [v for v in group if v.attempt.handle and v.job.allocation is not None]
            marked = [v.attempt.token for v in execs]
            self.store.update_attempts({t: {"state": JobState.CANCELLING, "reason": "cancelled by user"} for t in marked})
            try:
                await asyncio.gather(
                    *([infra.cancel([a.handle or "" for a in sent], [a.run_dir for a in sent])] if sent else []),
                    *(holder(infra).cancel_exec(v.attempt.handle or "", v.attempt.run_dir, v.job.id)
                      for v in execs))
            except BaseException:
                self.store.undo_cancelling(marked, JobState.RUNNING)
                raise
            now = time.time()
            # One not yet accepted (SUBMITTING: its answer may be lost while the cluster runs it) is not
            # settled by a cancel never sent: CANCELLING, the refresh finds it by token and the controller
            # cancels it there, or the refresh settles it CANCELLED once nothing can still be sending it.
            self.store.update_attempts({v.attempt.token: {"state": JobState.CANCELLED, "reason": "cancelled by user",
                                                          "ended_at": now} if v.attempt.handle else
                                        {"state": JobState.CANCELLING, "reason": "cancelled by user"}
                                        for v in group})

        await asyncio.gather(*(one(c, g) for c, g in by_account.items()))
        return live

    def check_logs(self, view: JobView, stderr: bool = False) -> None:
        """Refuse, before any output is streamed, a job whose logs (`stderr`: its --error file) cannot be read."""
        if not view.attempt.handle:
            raise CorralError(f"{view.job.id} has not reached its cluster yet ({view.attempt.state}); no logs")
        if stderr and not view.attempt.error_path:
            raise NotFoundError(f"{view.job.id} has no stderr file of its own: its stderr is in its output "
                                f"(`corral logs {view.job.id}`), as no sbatch --error sent it elsewhere (or none "
                                "was recorded: it was submitted before Corral recorded them)")
        check_log_kept(view.job.id, view.attempt, view.attempt.error_path if stderr else None)
        if view.job.allocation is not None:
            name = view.job.allocation
            held = self.store.allocation(name, view.job.owner)
            if held is None or held.handle != view.attempt.handle:
                raise CorralError(f"{view.job.id} ran in dev allocation {name!r} through `corral exec`; its output "
                                  "was kept in the allocation, which has been released since")
            if not view.attempt.log_path.endswith(f"/{EXEC_OUTPUT}"):
                raise CorralError(f"{view.job.id} ran in dev allocation {name!r} through `corral exec` before "
                                  "Corral kept an exec's output; it showed its output as it ran")

    async def logs(self, view: JobView, follow: bool, on_output: Callable[[bytes], None], tail: int = 0,
                   stderr: bool = False) -> None:
        self.check_logs(view, stderr)
        attempt = view.attempt
        infra = self.client.infra(attempt.cluster, view.job.owner)
        if view.job.allocation is not None:  # an exec: followed while it runs, not while its allocation does
            follow = follow and attempt.state not in TERMINAL_STATES
            await holder(infra).exec_output(attempt.handle or "", attempt.run_dir, view.job.id, follow,
                                                  on_output, tail)
            return
        await infra.logs(attempt.handle, attempt.error_path if stderr else attempt.log_path, follow, on_output, tail)


def check_log_kept(job_id: str, attempt: AttemptRow, path: str | None = None) -> None:
    """Refuse an attempt whose log (or `path`, its --error file) went with its run directory
    (run_files.py), saying so."""
    if attempt.run_dir_state == RunDirState.REMOVED and (path or attempt.log_path).startswith(attempt.run_dir + "/"):
        ended = f", {(time.time() - attempt.ended_at) / 86400:.0f} days ago" if attempt.ended_at else ""
        raise NotFoundError(f"{job_id} ended{ended}; its run directory on {attempt.cluster}, log included, was "
                            "removed since, as `run_dirs: {keep_days: N}` in the server's config.yaml says")


def about(cluster: str, exc: CorralError) -> str:
    """What went wrong with the cluster, for a report keyed by cluster: without the cluster's name that
    a ClusterError's message starts with ("could not refresh alpine: alpine: …" said it twice)."""
    if isinstance(exc, ClusterError) and exc.cluster == cluster:
        return exc.detail
    return str(exc)


def sent_by_account(store: Store, attempts: list[AttemptRow], handles: dict[str, str | None] | None = None
                    ) -> dict[tuple[str, str], list[tuple[AttemptRow, str]]]:
    """The attempts that reached their infra, with their handles, grouped by (cluster, owner): each
    group is one round trip as the account that owns those jobs there (accounts.py)."""
    handles = handles or {}
    sent = [(a, handles.get(a.token) or a.handle) for a in attempts if handles.get(a.token) or a.handle]
    owners = store.owners(a.job_id for a, _ in sent)
    groups: dict[tuple[str, str], list[tuple[AttemptRow, str]]] = {}
    for attempt, handle in sent:
        groups.setdefault((attempt.cluster, owners.get(attempt.job_id, "")), []).append((attempt, handle or ""))
    return groups


def by_attempt_token(statuses: list[JobStatus], infra: Infra) -> dict[str, JobStatus]:
    """Corral's jobs by the attempt token each stands for: its own token, plus the copy's index for an
    array's copies."""
    if not isinstance(infra, RunsArrays):
        return {s.token: s for s in statuses if s.token}
    out: dict[str, JobStatus] = {}
    for status in statuses:
        if status.token:
            index = infra.array_index(status.handle)
            out[f"{status.token}.{index}" if index is not None else status.token] = status
    return out


@functools.cache
def _getter(keys: tuple[str, ...]) -> operator.attrgetter[tuple[object, ...]]:
    """Those attributes of a row in one C call: the quiet tick compares 10,000 attempts this way."""
    return operator.attrgetter(*keys)


def _updates(attempts: list[AttemptRow], statuses: list[JobStatus], by_name: dict[str, JobStatus],
             quiet: set[str], sending: set[str]) -> tuple[dict[str, dict[str, object]], dict[str, dict[str, object]]]:
    """What changed for these attempts, by the infra's answer; and, apart, how those never answered
    are settled (Store.settle_unanswered: not where an answer has been written since). Read before the
    query: `quiet`, submitters that can no longer be sending anything (liveness.quiet_senders);
    `sending`, tokens this process was sending (liveness.SENDING)."""
    by_id = {s.handle: s for s in statuses}
    now = time.time()
    updates: dict[str, dict[str, object]] = {}
    settled: dict[str, dict[str, object]] = {}
    for attempt in attempts:
        # By name first: tokens are unique, while job ids restart when a cluster's state is reset. A
        # job found only in part is not adopted: the rest may still be on its way (JobStatus.partial).
        status = by_name.get(attempt.token) or by_id.get(attempt.handle or "")
        if status is not None and status.partial:
            status = None
        if status is None:
            if attempt.handle is None:
                # Never while this process is sending it (its files may take long). Else settled at once
                # when nothing can still be sending it (its submitter gone, with its ssh clients), or
                # after the grace period; a copy that turns up later is an orphan, reaped.
                if attempt.token in sending:
                    continue
                if attempt.submitter in quiet or now - attempt.created_at > SUBMIT_GRACE_SECONDS:
                    if attempt.state == JobState.CANCELLING:  # cancelled before its submission was answered
                        settled[attempt.token] = {"state": JobState.CANCELLED, "ended_at": now,
                                                  "reason": attempt.reason}
                        continue
                    settled[attempt.token] = {"state": JobState.SUBMIT_FAILED, "ended_at": now,
                                              "failure": FailureClass.LOST.value,
                                              "reason": "interrupted before Slurm accepted the job"}
            else:
                updates[attempt.token] = {"state": JobState.LOST, "ended_at": now, "failure": FailureClass.LOST.value,
                                          "reason": "Slurm no longer knows this job (purged after MinJobAge; "
                                                    "the cluster has no accounting)"}
            continue
        if status.state is JobState.UNKNOWN and attempt.handle is not None:
            continue  # the infra cannot tell now (a machine that has just stopped answering): nothing changes
        fields: dict[str, object] = {
            "state": status.state.value,
            "reason": status.reason if status.state is not JobState.SUCCEEDED else None,
            "submitted_at": status.submitted_at or attempt.submitted_at,
            # An end the infra declared without seeing the job (a machine that stopped answering) keeps its start.
            "started_at": status.started_at or (attempt.started_at if status.state in TERMINAL_STATES else None),
            "expected_start": status.expected_start,
            "ended_at": status.ended_at,
            "exit_code": status.exit_code,
            "failure": status.failure.value if status.failure else None,
        }
        if attempt.handle is None or status.moved:  # adopted after an interrupted submission, or moved
            fields["handle"] = status.handle
        if attempt.state in (JobState.CANCELLED, JobState.CANCELLING) and status.state in LIVE_STATES:
            fields["state"] = attempt.state  # cancel sent (or due); the infra has not caught up yet
            fields["reason"] = attempt.reason
        elif attempt.state == JobState.CANCELLING and status.state is JobState.CANCELLED:
            fields["reason"] = attempt.reason  # why Corral cancelled it (a move, an outage), not Slurm's word
        if status.state is JobState.FAILED and status.native_state != JobState.FAILED.value:
            # NODE_FAIL, TIMEOUT, PREEMPTED, OUT_OF_MEMORY…: the infra's word first, its reason after.
            fields["reason"] = status.native_state + (f" ({status.reason})" if status.reason else "")
        if _getter(tuple(fields))(attempt) != tuple(fields.values()):
            updates[attempt.token] = fields  # a quiet tick writes nothing
    return updates, settled


class SharedRefresh:
    """One refresh at a time in a process that serves many callers (the server: its ticks and its API).
    A caller that arrives while one runs shares its result, and one that finished less than `max_age`
    seconds ago is reused: a `queue` right after a tick costs no second query per cluster. A caller that
    accepts a refresh `fresh_within` seconds old (the API) does not wait for a running one when the last
    one finished that recently: under load, when refreshes follow each other (and wait for budget), a
    `queue` answers at once from the store, as of at most that many seconds ago. A caller that waits
    `at_most` seconds (the API, the tick) gets the refresh as far as it has come by then
    (`Tracker.so_far`): a cluster slow to answer (its controller down: `squeue` fails after seconds)
    holds up no request, and the refresh goes on behind it. A caller that needs a refresh newer than the
    running one (the next tick, while a slow cluster holds that one up) starts another: it asks the
    other clusters afresh and joins the slow one's query (`Flights`)."""

    def __init__(self, max_age: float = 1.0):
        self.max_age = max_age
        self.scope: RefreshScope | None = None  # set by the controller each tick (None: everything)
        self.flights = Flights()  # each cluster's query, shared by every refresh of this process
        self._running: tuple[asyncio.Future[RefreshReport], Tracker, float] | None = None  # (…, started)
        self._last: tuple[float, float, RefreshReport] | None = None  # (started, finished, report), monotonic

    async def refresh(self, tracker: Tracker, *, newer_than: float = 0.0, fresh_within: float = 0.0,
                      at_most: float | None = None, skip_failing: bool = False) -> RefreshReport:
        """A refresh at most `max_age` old that started at or after `newer_than` (time.monotonic()); or,
        while one runs, the last one if it finished less than `fresh_within` seconds ago; or, once the
        running one has run `at_most` seconds, that one as far as it has come (a request that joins a
        refresh already stuck that long on a cluster does not wait for it again). A refresh this call
        starts does not wait for a cluster's query older than `at_most`, nor (`skip_failing`: the API's
        requests) for one whose last query failed."""
        now = time.monotonic()
        last = self._last if self._last is not None and self._last[0] >= newer_than else None
        if self._running is None or self._running[2] < newer_than:
            if self._running is None and last is not None and now - last[1] < self.max_age:
                return last[2]
            self._running = self._start(tracker, now, at_most, skip_failing)
        elif last is not None and now - last[1] < fresh_within:
            return last[2]
        running, doing, started = self._running
        deadline = None if at_most is None else max(0.0, started + at_most - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.shield(running), deadline)
        except TimeoutError:
            if running.done():  # it ended as the wait did
                return running.result()
            return doing.so_far()

    def _start(self, tracker: Tracker, started: float, patience: float | None, skip_failing: bool
               ) -> tuple[asyncio.Future[RefreshReport], Tracker, float]:
        tracker.flights = self.flights
        running = asyncio.ensure_future(tracker.refresh(self.scope, patience, skip_failing))

        def finished(future: asyncio.Future[RefreshReport]) -> None:
            if self._running is not None and self._running[0] is future:
                self._running = None
            # exception(): retrieved, if no one waits. An older refresh that ends after a newer one is not
            # the last.
            if not future.cancelled() and future.exception() is None \
                    and (self._last is None or self._last[0] <= started):
                self._last = (started, time.monotonic(), future.result())

        running.add_done_callback(finished)
        return running, tracker, started
