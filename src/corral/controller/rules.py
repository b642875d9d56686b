"""The controller's rules: what to do with one managed job this tick, decided from its rows alone.

`decide` reads a managed job's row and its attempts (oldest first) and returns a `Decision`: the job's
new state, attempts to cancel or mark, whether it needs a new attempt, may move, or may be released.
It does no I/O: no store, no backend, and it reads no clock (the tick's `now` is given). When a rule
needs a fact that costs I/O (the task's `job_recovery`, read from the store; whether the attempt
failed in `setup`, one round trip), the decision says so in `needs`, and the engine fetches that fact
and asks again. The engine (engine.py) carries decisions out; the rules are unit-tested on plain rows
(tests/controller/test_rules.py). Cost: a few comparisons per attempt.

The rules, in the order they apply:
- cancel requested: CANCELLED, every live attempt cancelled;
- two attempts running at once (a re-route race): keep the one that started first, cancel the other
  (a newer attempt cancelled so never stands for the job: the kept one's fate is the job's);
- an older attempt succeeded after all (its kill was lost): SUCCEEDED, newer ones cancelled;
- a job group's auxiliary task, once every primary task of its group has ended and its termination
  delay has passed: CANCELLED, its attempts cancelled;
- no attempt yet: a first attempt; for a pipeline's later task, only once the task before it has
  succeeded (it waits PENDING until then, and is CANCELLED, skipped, when that task ended otherwise);
  a job group's tasks start side by side;
- its cluster unreachable beyond the grace period: the attempt is marked CANCELLING (cancelled once
  the cluster answers again) and the job recovers elsewhere, unless `job_recovery: none`;
- a held move waits until the attempt it replaces is known ended, and the task-side cancel fence has
  had its time; then it is released;
- pending long enough: a candidate for a move (the engine's re-routing decides where, if anywhere),
  but for a job group's task, which stays on its group's cluster;
- the infrastructure failed it (node failure, preemption, a job the backend lost, a submission no
  cluster took): a new attempt, unless its last `max_launch_failures` attempts all ended at once;
- the task itself failed: FAILED_SETUP if `setup` failed, else a restart if `recover_on_exit_codes`
  or `max_restarts_on_errors` say so, else FAILED;
- a job that ends, or gets a new attempt, leaves nothing else running: every other live attempt is
  cancelled.
Every attempt a rule cancels is marked CANCELLING first, and stays so until its cluster confirms it
ended: the engine cancels CANCELLING attempts again on every tick their cluster answers, whether their
job is live or not (a cluster down at the time, a kill lost while Slurm launched the job).

Where a job goes is decided here too, from the tick's plan: a recovered attempt's order of places
(`recovery_order`), and a pending job's move (`move_to_start_now`, else `move_by_prediction`).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from corral.config import env_number
from corral.infra.base import FailureClass, JobState
from corral.placement import Candidate, Plan
from corral.state.models import MANAGED_TERMINAL_STATES, AttemptRow, ManagedJobRow, ManagedState
from corral.state.store import TERMINAL_STATES
from corral.task import JobRecovery, RecoveryStrategy
from corral.timefmt import clock, minutes

# How long a held replacement waits after its predecessor ended, for the task-side cancel fence: the
# watcher in TASK_SH sees the marker within a second, and a task that outlives TERM for 10 s is KILLed.
CANCEL_FENCE_SECONDS = 12.0
DUPLICATE = "duplicate of attempt"  # the reason of an attempt cancelled because an older one started first
QUICK_FAILURE_SECONDS = 60.0  # an attempt the infrastructure ended this soon after it started never really ran
LIVE_ON_A_CLUSTER = frozenset({JobState.PENDING, JobState.STARTING, JobState.RUNNING, JobState.SUBMITTING})


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
    status_wait: float = 3.0  # seconds a tick waits for the clusters' status answers; a slower one is as last seen
    submit_wait: float = 5.0  # seconds a tick waits for its submissions; a slower one goes on beside the next ticks

    def margin(self, here_start: float, now: float) -> float:
        """How much sooner another cluster must be predicted to start a job before it moves there."""
        return max(self.reroute_margin, self.reroute_margin_fraction * max(0.0, here_start - now))

    @classmethod
    def from_env(cls) -> ControllerSettings:
        settings = cls()
        for name in ("grace_seconds", "reroute_after", "reroute_cooldown", "reroute_margin", "reroute_margin_fraction",
                     "predict_interval", "unhealthy_seconds", "lease_seconds", "status_wait",
                     "submit_wait"):
            setattr(settings, name, env_number(f"CORRAL_CONTROLLER_{name.upper()}", getattr(settings, name)))
        return settings


@dataclass(frozen=True)
class Context:
    """What every decision of one tick shares."""

    now: float
    unreachable: frozenset[str]  # clusters unreachable beyond the grace period
    settings: ControllerSettings
    where: Callable[[str, str], str]  # (cluster, partition) -> the place's name as people read it
    # A pipeline's later task that has no attempt yet -> the task before it (its row as read this tick).
    before: Mapping[str, ManagedJobRow] = field(default_factory=dict)
    # A job group's auxiliary task -> the group's primary tasks (their rows as read this tick).
    primaries: Mapping[str, tuple[ManagedJobRow, ...]] = field(default_factory=dict)


class Need(enum.Enum):
    """A fact a rule needs that costs I/O: the engine fetches it and decides again."""

    RECOVERY = "the task's job_recovery"  # a store read
    SETUP_FAILED = "whether setup failed"  # a round trip to the attempt's cluster


@dataclass(frozen=True)
class Facts:
    """The facts fetched so far for one job's decision (`known` says which were)."""

    known: frozenset[Need] = frozenset()
    recovery: JobRecovery | None = None
    setup_failed: bool = False


@dataclass
class Decision:
    """What the engine does for one managed job this tick; the default does nothing."""

    state: ManagedState | None = None  # the job's state from now on (None: as it is)
    reason: str | None = None
    fields: dict[str, object] = field(default_factory=dict)  # counters written with the state
    note: str | None = None  # an event recorded without a change of state
    cancel: list[AttemptRow] = field(default_factory=list)  # attempts to cancel on their cluster
    mark: dict[str, dict[str, object]] = field(default_factory=dict)  # attempt token -> fields written now
    place: str | None = None  # it needs a new attempt: why
    may_move: AttemptRow | None = None  # pending long enough: re-routing may move this attempt
    release: AttemptRow | None = None  # a held move may start
    failed_on: str | None = None  # the cluster whose infrastructure failed it (counts towards unhealthy)
    running_on: str | None = None  # the cluster it runs on (resets that cluster's failures in a row)
    needs: Need | None = None  # decide again once this is known; nothing else is set


def decide(m: ManagedJobRow, attempts: list[AttemptRow], context: Context, facts: Facts = Facts()) -> Decision:
    """What to do with managed job `m` this tick, given its attempts (oldest first). A job that ends, or
    gets a new attempt, leaves nothing else running: any other attempt still live is cancelled (marked
    CANCELLING first)."""
    decision = _decide(m, attempts, context, facts)
    if decision.state in MANAGED_TERMINAL_STATES or decision.place:
        for left in attempts:
            if (left.state not in TERMINAL_STATES and left.state != JobState.CANCELLING
                    and left.token not in decision.mark):
                decision.cancel.append(left)
                decision.mark[left.token] = {"state": JobState.CANCELLING, "reason": (
                    f"replaced by a new attempt ({decision.place})" if decision.place
                    else f"its job ended ({decision.state})")}
    return decision


def _decide(m: ManagedJobRow, attempts: list[AttemptRow], context: Context, facts: Facts) -> Decision:
    now = context.now
    live = [a for a in attempts if a.state not in TERMINAL_STATES]
    # The attempt that stands for the job: the newest, unless it was cancelled as a duplicate of an
    # older one that started first (then the older one's fate is the job's).
    latest = next((a for a in reversed(attempts) if not (a.reason or "").startswith(DUPLICATE)),
                  attempts[-1] if attempts else None)
    if m.cancel_requested:
        return Decision(ManagedState.CANCELLED, "cancelled by user", cancel=live,
                        mark=_cancelling(live, "cancelled by user"))
    if m.auxiliary and (stop := _auxiliary_stop(m, context, started=bool(attempts))):
        return Decision(ManagedState.CANCELLED, stop, cancel=live, mark=_cancelling(live, stop))
    decision = Decision()
    running = sorted((a for a in live if a.state in (JobState.RUNNING, JobState.STARTING)),
                     key=lambda a: (a.started_at or now, a.number))
    if len(running) > 1:  # a re-route raced with the old attempt starting: keep the first
        for extra in running[1:]:
            decision.cancel.append(extra)
            decision.mark[extra.token] = {"state": JobState.CANCELLING, "reason": f"{DUPLICATE} {running[0].number}"}
        decision.note = (f"attempts {', '.join(str(a.number) for a in running)} both started; "
                         f"kept attempt {running[0].number}")
        latest = running[0]
    succeeded = next((a for a in attempts if a.state == JobState.SUCCEEDED), None)
    if succeeded is not None and succeeded is not latest:
        # An attempt Corral had moved away from ran after all (its kill was lost while Slurm was
        # launching it) and succeeded: the job is done; newer attempts must not run it again.
        for extra in live:
            if extra.token not in decision.mark:
                decision.cancel.append(extra)
            decision.mark[extra.token] = {"state": JobState.CANCELLING,
                                          "reason": f"attempt {succeeded.number} had already succeeded"}
        return _with_state(decision, ManagedState.SUCCEEDED, f"attempt {succeeded.number} succeeded (it ran although "
                                                             "it had been moved; later attempts cancelled)")
    if latest is None:
        if m.pipeline_stage and not m.pipeline_parallel:
            return _after_the_task_before(decision, m, context.before.get(m.job_id))
        decision.place = "first attempt"
        return decision
    state = latest.state
    if latest.cluster in context.unreachable and state in LIVE_ON_A_CLUSTER:
        why = f"{latest.cluster} unreachable for more than {context.settings.grace_seconds:g}s"
        # Cancelled in Slurm as soon as the cluster answers again, so it never runs twice for long.
        decision.mark[latest.token] = {"state": JobState.CANCELLING, "reason": why}
        return _recover(decision, m, why, facts)
    if state in (JobState.SUBMITTING, JobState.CANCELLING):
        return decision
    if state == JobState.PENDING and latest.held:
        # A move's attempt waits, held, until the attempt it replaces is known not to run...
        blocking = [a for a in live if a is not latest and a.cluster not in context.unreachable]
        # ... and for a few seconds more: the task's own cancel fence ends a task that Slurm's kill
        # missed within a second of the cancel marker (see TASK_SH).
        fencing = [a for a in attempts if a is not latest and a.state in (JobState.CANCELLED, JobState.FAILED)
                   and now - (a.ended_at or 0) < CANCEL_FENCE_SECONDS]
        if blocking or fencing:
            return _with_state(decision, ManagedState.PENDING, f"attempt {latest.number} held until attempt "
                                                               f"{(blocking or fencing)[0].number} is confirmed cancelled")
        decision.release = latest
        return decision
    if state == JobState.PENDING:
        # A job group's task stays on its group's cluster, where the other tasks can reach it.
        if now - (latest.submitted_at or now) >= context.settings.reroute_after and not m.pipeline_parallel:
            decision.may_move = latest
        return _with_state(decision, ManagedState.PENDING if m.recoveries == 0 else ManagedState.RECOVERING,
                           latest.reason or "pending")
    if state in (JobState.STARTING, JobState.RUNNING):
        decision.running_on = latest.cluster
        return _with_state(decision, ManagedState(state), f"on {context.where(latest.cluster, latest.partition)} "
                                                          f"(attempt {latest.number})")
    if state == JobState.SUCCEEDED:
        return _with_state(decision, ManagedState.SUCCEEDED, f"attempt {latest.number} succeeded")
    if state == JobState.CANCELLED:
        if latest.reason and latest.reason.startswith(("re-routed", DUPLICATE)):
            return decision  # replaced by a newer attempt, which is the latest once recorded
        return _with_state(decision, ManagedState.CANCELLED, latest.reason or "cancelled in Slurm")
    if state in (JobState.SUBMIT_FAILED, JobState.LOST) or infra_failure(latest):
        why = f"attempt {latest.number} on {latest.cluster}: {latest.reason or state}"
        quick = launch_failures_in_a_row(attempts)
        if quick >= context.settings.max_launch_failures:
            decision.failed_on = latest.cluster
            return _with_state(decision, ManagedState.FAILED, f"{why}; not recovered again: its last {quick} "
                                                              "attempts all ended as soon as they started (look at "
                                                              "its resources and sbatch_args)")
        recovered = _recover(decision, m, why, facts)
        if recovered.needs is None:
            recovered.failed_on = latest.cluster
        return recovered
    if state == JobState.FAILED:
        return _task_failed(decision, m, latest, facts)
    return decision


def _task_failed(decision: Decision, m: ManagedJobRow, latest: AttemptRow, facts: Facts) -> Decision:
    """The task itself failed: not retried when its setup failed (it would fail again), else as its
    `job_recovery` says."""
    if Need.SETUP_FAILED not in facts.known:
        return Decision(needs=Need.SETUP_FAILED)
    code = latest.exit_code
    if facts.setup_failed:
        return _with_state(decision, ManagedState.FAILED_SETUP, f"setup failed on attempt {latest.number} "
                                                                f"(exit code {code})")
    if Need.RECOVERY not in facts.known:
        return Decision(needs=Need.RECOVERY)
    recovery = facts.recovery
    if recovery and code is not None and code in recovery.recover_on_exit_codes:
        decision.place = f"exit code {code}"
        return _with_state(decision, ManagedState.RECOVERING, f"exit code {code} is listed to recover")
    if recovery and m.restarts_on_errors < recovery.max_restarts_on_errors:
        decision.place = f"exit code {code}"
        decision.fields["restarts_on_errors"] = m.restarts_on_errors + 1
        return _with_state(decision, ManagedState.RECOVERING, f"exit code {code}: restart "
                                                              f"{m.restarts_on_errors + 1} of "
                                                              f"{recovery.max_restarts_on_errors}")
    return _with_state(decision, ManagedState.FAILED, f"attempt {latest.number} failed "
                                                      f"(exit code {code}, {latest.reason or 'FAILED'})")


def _recover(decision: Decision, m: ManagedJobRow, why: str, facts: Facts) -> Decision:
    """After an infrastructure failure: a new attempt, unless the task says `job_recovery: none`."""
    if Need.RECOVERY not in facts.known:
        return Decision(needs=Need.RECOVERY)
    if facts.recovery is not None and facts.recovery.strategy is RecoveryStrategy.NONE:
        return _with_state(decision, ManagedState.FAILED, f"{why}; not recovered (job_recovery: none)")
    decision.place = why
    decision.fields["recoveries"] = m.recoveries + 1
    return _with_state(decision, ManagedState.RECOVERING, why)


def _cancelling(attempts: list[AttemptRow], reason: str) -> dict[str, dict[str, object]]:
    """Attempts to cancel, marked CANCELLING first: where the cancel does not reach the cluster now,
    the engine cancels them again on every tick until the cluster answers (`Controller._cancel_again`).
    Those already CANCELLING keep their reason (a move, an outage)."""
    return {a.token: {"state": JobState.CANCELLING, "reason": reason} for a in attempts
            if a.state != JobState.CANCELLING}


def _after_the_task_before(decision: Decision, m: ManagedJobRow, before: ManagedJobRow | None) -> Decision:
    """A pipeline's later task starts once the task before it has succeeded, and is skipped (CANCELLED)
    when that one ended otherwise: as a SkyPilot pipeline's tasks run one after another."""
    if before is None:  # fail closed: a task whose predecessor cannot be read never runs out of order
        return _with_state(decision, ManagedState.CANCELLED, "skipped: the pipeline's task before it is gone")
    which = f"task {before.pipeline_stage} ({before.job_id})"
    if before.state == ManagedState.SUCCEEDED:
        decision.place = f"first attempt, after {which} succeeded"
        return _with_state(decision, ManagedState.PENDING, f"the pipeline's {which} succeeded")
    if before.state in MANAGED_TERMINAL_STATES:
        return _with_state(decision, ManagedState.CANCELLED, f"skipped: the pipeline's {which} ended {before.state}")
    return _with_state(decision, ManagedState.PENDING, f"waiting for the pipeline's {which} to succeed")


def _auxiliary_stop(m: ManagedJobRow, context: Context, started: bool) -> str | None:
    """Why a job group's auxiliary task is stopped now: every primary task of its group has ended, and
    its termination delay has passed since the last one did (at once when it never started). None
    while a primary task is live, or its primaries were not read (they are, every tick it is live)."""
    primaries = context.primaries.get(m.job_id)
    if not primaries or any(p.state not in MANAGED_TERMINAL_STATES for p in primaries):
        return None
    delay = m.termination_delay or 0.0
    last_end = min(max(p.updated_at for p in primaries), context.now)  # one that ended this tick: now
    if started and context.now < last_end + delay:
        return None
    which = ", ".join(f"{p.job_id} {p.state}" for p in primaries)
    if not started:
        return f"not started: the job group's primary tasks have ended ({which})"
    return (f"stopped: the job group's primary tasks have ended ({which})"
            + (f", and its termination_delay of {delay:g}s has passed" if delay else ""))


def _with_state(decision: Decision, state: ManagedState, reason: str) -> Decision:
    decision.state, decision.reason = state, reason
    return decision


def infra_failure(attempt: AttemptRow) -> bool:
    return attempt.state == JobState.FAILED and attempt.failure == FailureClass.INFRA


def launch_failures_in_a_row(attempts: list[AttemptRow]) -> int:
    """How many of a job's latest attempts (oldest first in `attempts`) the infrastructure ended before
    or within QUICK_FAILURE_SECONDS of their start: a job Slurm fails to launch wherever it goes, not one
    a cluster lost while it ran. Submissions that reached no cluster neither count nor end the run."""
    count = 0
    for attempt in reversed(attempts):
        if attempt.state == JobState.SUBMIT_FAILED:
            continue
        ran = (attempt.ended_at or 0.0) - (attempt.started_at or attempt.ended_at or 0.0)
        if not infra_failure(attempt) or ran > QUICK_FAILURE_SECONDS:
            break
        count += 1
    return count


# ---- where a job goes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Move:
    """A pending job's move: where to, and why (as the job's reason says it)."""

    target: Candidate
    why: str

    @property
    def place(self) -> tuple[str, str]:
        return self.target.cluster, self.target.partition


def starts_where_it_is(current: AttemptRow, plan: Plan) -> bool:
    """Whether the cluster the job waits on can start it now (then Slurm will: it stays)."""
    here = candidate_at(plan, current)
    return here is not None and here.startable_now


def move_to_start_now(current: AttemptRow, plan: Plan, taken: dict[tuple[str, str], int],
                      avoid: set[str] | frozenset[str]) -> Move | None:
    """The best other place that can start the job now, after what this tick already moved or placed
    there (`taken`); None when there is none."""
    best = next((c for c in after_taken(plan.feasible(), taken)
                 if c.startable_now and c.cluster not in avoid
                 and (c.cluster, c.partition) != (current.cluster, current.partition)), None)
    if best is None:
        return None
    return Move(best, f"re-routed to {best.infra}: it can start now; {current.cluster} had it pending "
                      f"({current.reason or 'pending'})")


def move_by_prediction(current: AttemptRow, plan: Plan, avoid: set[str] | frozenset[str],
                       settings: ControllerSettings, now: float) -> Move | None:
    """Where nowhere can start the job now: the place predicted to start it soonest, if that beats its
    current start by `settings.margin` (hysteresis: a move costs the job its place in the queue)."""
    here = candidate_at(plan, current)
    here_start = current.expected_start or (here.predicted_start if here else None)
    # Places that can start it now are move_to_start_now's, with this tick's capacity count.
    alternatives = [c for c in plan.feasible() if c.predicted_start is not None and not c.startable_now
                    and c.cluster not in avoid and (c.cluster, c.partition) != (current.cluster, current.partition)]
    if here_start is None or not alternatives:
        return None
    best = min(alternatives, key=lambda c: c.predicted_start or math.inf)
    gain = here_start - (best.predicted_start or math.inf)
    if gain < settings.margin(here_start, now):
        return None
    return Move(best, f"re-routed to {best.infra}: predicted to start there at {clock(best.predicted_start)}, "
                      f"{minutes(gain)} sooner than on {current.cluster} ({clock(here_start)}, "
                      f"{current.reason or 'pending'})")


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


def group_cluster(feasible: list[list[Candidate]]) -> str | None:
    """The cluster a job group runs on: of those that can run every one of its tasks (each task's
    feasible places in order of preference), the one whose worst rank over the tasks is best (then the
    best sum of ranks): the group starts when its last task does. None when no cluster can run all."""
    ranks: list[dict[str, int]] = []
    for candidates in feasible:
        first: dict[str, int] = {}
        for rank, candidate in enumerate(candidates):
            first.setdefault(candidate.cluster, rank)
        ranks.append(first)
    common = set.intersection(*(set(r) for r in ranks)) if ranks else set()
    if not common:
        return None
    return min(common, key=lambda c: (max(r[c] for r in ranks), sum(r[c] for r in ranks), c))


def recovery_order(feasible: list[Candidate], strategy: RecoveryStrategy | None,
                   previous: str | None) -> list[Candidate]:
    """Where a recovered attempt goes (SkyPilot's strategies): FAILOVER tries the cluster the job was on
    first, EAGER_NEXT_REGION tries it last; unset, placement's ranking (soonest start) decides alone."""
    if previous is None or strategy not in (RecoveryStrategy.FAILOVER, RecoveryStrategy.EAGER_NEXT_REGION):
        return feasible
    same = [c for c in feasible if c.cluster == previous]
    others = [c for c in feasible if c.cluster != previous]
    return same + others if strategy is RecoveryStrategy.FAILOVER else others + same


def candidate_at(plan: Plan, attempt: AttemptRow) -> Candidate | None:
    return next((c for c in plan.candidates if (c.cluster, c.partition) == (attempt.cluster, attempt.partition)), None)

