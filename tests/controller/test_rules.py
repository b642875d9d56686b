"""The controller's rules on plain rows: no store, no backend, no clock (rules.py). The engine that
carries the decisions out is tested end to end in tests/test_seam.py and on the testbed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.controller.rules import (
    CANCEL_FENCE_SECONDS,
    Context,
    ControllerSettings,
    Facts,
    Need,
    after_taken,
    decide,
    group_cluster,
    move_by_prediction,
    move_to_start_now,
    starts_where_it_is,
)
from corral.infra.base import FailureClass, JobState
from corral.placement import Candidate, Plan
from corral.state.models import MANAGED_TERMINAL_STATES, AttemptRow, ManagedJobRow, ManagedState
from corral.state.store import TERMINAL_STATES
from corral.task import JobRecovery, parse_task, resource_options

NOW = 10_000.0
CONTEXT = Context(NOW, frozenset(), ControllerSettings(), lambda cluster, partition: f"slurm/{cluster}/{partition}")


def managed(**fields: object) -> ManagedJobRow:
    row = ManagedJobRow(job_id="j1", state=ManagedState.PENDING, reason=None, restarts_on_errors=0, recoveries=0,
                        moves=0, last_move_at=0.0, cancel_requested=False)
    for key, value in fields.items():
        setattr(row, key, value)
    return row


def attempt(number: int, state: JobState, cluster: str = "alpine", **fields: object) -> AttemptRow:
    row = AttemptRow(token=f"t{number}", job_id="j1", number=number, cluster=cluster, partition="gpu",
                     handle=str(number), state=state, reason=None, run_dir="", log_path="", submitted_at=NOW - 60,
                     started_at=None, ended_at=None, exit_code=None, failure=None, held=None)
    for key, value in fields.items():
        setattr(row, key, value)
    return row


def known(recovery: JobRecovery | None = None, setup_failed: bool = False) -> Facts:
    return Facts(frozenset(Need), recovery, setup_failed)


def test_a_job_without_attempts_gets_its_first():
    decision = decide(managed(), [], CONTEXT)
    assert decision.place == "first attempt" and decision.state is None and not decision.cancel


def pipeline_task(stage: int, state: ManagedState = ManagedState.PENDING, job_id: str = "j1") -> ManagedJobRow:
    return managed(job_id=job_id, state=state, pipeline_id="j0", pipeline_name="pipe", pipeline_stage=stage)


@pytest.mark.parametrize("state", [ManagedState.PENDING, ManagedState.STARTING, ManagedState.RUNNING,
                                   ManagedState.RECOVERING, ManagedState.CANCELLING])
def test_a_pipeline_task_waits_while_the_task_before_it_has_not_ended(state):
    context = Context(NOW, frozenset(), ControllerSettings(), CONTEXT.where, {"j1": pipeline_task(0, state, "j0")})
    decision = decide(pipeline_task(1), [], context)
    assert decision.place is None and not decision.cancel
    assert (decision.state, decision.reason) == (ManagedState.PENDING,
                                                 "waiting for the pipeline's task 0 (j0) to succeed")


def test_a_pipeline_task_starts_once_the_task_before_it_succeeded():
    context = Context(NOW, frozenset(), ControllerSettings(), CONTEXT.where,
                      {"j1": pipeline_task(0, ManagedState.SUCCEEDED, "j0")})
    decision = decide(pipeline_task(1), [], context)
    assert decision.place == "first attempt, after task 0 (j0) succeeded"
    assert (decision.state, decision.reason) == (ManagedState.PENDING, "the pipeline's task 0 (j0) succeeded")


@pytest.mark.parametrize("state", [ManagedState.FAILED, ManagedState.FAILED_SETUP, ManagedState.CANCELLED])
def test_a_pipeline_task_is_skipped_when_the_task_before_it_did_not_succeed(state):
    context = Context(NOW, frozenset(), ControllerSettings(), CONTEXT.where, {"j1": pipeline_task(0, state, "j0")})
    decision = decide(pipeline_task(1), [], context)
    assert decision.place is None
    assert (decision.state, decision.reason) == (ManagedState.CANCELLED,
                                                 f"skipped: the pipeline's task 0 (j0) ended {state}")


def test_a_pipeline_task_whose_predecessor_cannot_be_read_never_runs():
    decision = decide(pipeline_task(1), [], CONTEXT)
    assert decision.place is None and decision.state == ManagedState.CANCELLED


def test_a_pipelines_first_task_and_a_task_with_attempts_go_as_any_job():
    assert decide(pipeline_task(0), [], CONTEXT).place == "first attempt"
    running = decide(pipeline_task(1), [attempt(1, JobState.RUNNING)], CONTEXT)  # no predecessor asked for
    assert running.state == ManagedState.RUNNING and running.place is None


def group_task(stage: int, state: ManagedState = ManagedState.PENDING, job_id: str = "j1",
               delay: float | None = None, updated_at: float = NOW) -> ManagedJobRow:
    return managed(job_id=job_id, state=state, pipeline_id="j0", pipeline_name="grp", pipeline_stage=stage,
                   pipeline_parallel=True, termination_delay=delay, updated_at=updated_at)


def with_primaries(*rows: ManagedJobRow) -> Context:
    return Context(NOW, frozenset(), ControllerSettings(), CONTEXT.where, primaries={"j1": rows})


def test_a_job_groups_later_task_starts_at_once_without_waiting_for_the_one_before():
    decision = decide(group_task(2), [], CONTEXT)
    assert decision.place == "first attempt" and decision.state is None


def test_a_job_groups_pending_task_is_never_moved_away_from_its_group():
    pending = attempt(1, JobState.PENDING, submitted_at=NOW - 3600)
    assert decide(group_task(1), [pending], CONTEXT).may_move is None
    assert decide(managed(), [pending], CONTEXT).may_move is pending  # the same job alone may move


@pytest.mark.parametrize("state", [ManagedState.PENDING, ManagedState.RUNNING, ManagedState.RECOVERING])
def test_an_auxiliary_task_runs_on_while_a_primary_task_is_live(state):
    context = with_primaries(group_task(0, ManagedState.SUCCEEDED, "j0"), group_task(2, state, "j2"))
    decision = decide(group_task(1, delay=0.0), [attempt(1, JobState.RUNNING)], context)
    assert decision.state == ManagedState.RUNNING and not decision.cancel


def test_an_auxiliary_task_is_stopped_its_delay_after_the_last_primary_task_ended():
    running = attempt(1, JobState.RUNNING)
    ended = with_primaries(group_task(0, ManagedState.SUCCEEDED, "j0", updated_at=NOW - 50),
                           group_task(2, ManagedState.FAILED, "j2", updated_at=NOW - 20))
    waiting = decide(group_task(1, ManagedState.RUNNING, delay=30.0), [running], ended)
    assert waiting.state == ManagedState.RUNNING and not waiting.cancel  # 20 s since the last one: not yet
    stopped = decide(group_task(1, ManagedState.RUNNING, delay=20.0), [running], ended)
    assert stopped.state == ManagedState.CANCELLED and stopped.cancel == [running]
    assert stopped.mark[running.token]["state"] == JobState.CANCELLING
    assert stopped.reason == ("stopped: the job group's primary tasks have ended (j0 SUCCEEDED, j2 FAILED), and its "
                              "termination_delay of 20s has passed")


def test_an_auxiliary_task_that_never_started_is_not_started_once_the_primary_tasks_ended():
    ended = with_primaries(group_task(0, ManagedState.SUCCEEDED, "j0"))
    decision = decide(group_task(1, delay=600.0), [], ended)
    assert decision.place is None and decision.state == ManagedState.CANCELLED
    assert decision.reason == "not started: the job group's primary tasks have ended (j0 SUCCEEDED)"


def test_an_auxiliary_task_whose_primaries_were_not_read_goes_on_as_any_job():
    decision = decide(group_task(1, delay=0.0), [attempt(1, JobState.RUNNING)], CONTEXT)
    assert decision.state == ManagedState.RUNNING


def test_a_job_group_runs_where_every_task_can_run_and_its_last_task_starts_soonest():
    def at(*clusters: str) -> list[Candidate]:
        return [place(c) for c in clusters]

    assert group_cluster([at("alpine", "borealis"), at("borealis", "cirrus")]) == "borealis"
    # alpine is first for one task but third for the other; cirrus is second for both
    assert group_cluster([at("alpine", "cirrus", "borealis"), at("borealis", "cirrus", "alpine")]) == "cirrus"
    assert group_cluster([at("alpine"), at("cirrus")]) is None
    assert group_cluster([]) is None


def test_a_cancel_request_cancels_every_live_attempt_and_nothing_ended():
    live, ended = attempt(2, JobState.RUNNING), attempt(1, JobState.FAILED)
    decision = decide(managed(cancel_requested=True), [ended, live], CONTEXT)
    assert decision.state is ManagedState.CANCELLED and decision.cancel == [live] and decision.place is None


def test_two_running_attempts_keep_the_one_that_started_first():
    first = attempt(1, JobState.RUNNING, started_at=NOW - 30)
    second = attempt(2, JobState.RUNNING, "borealis", started_at=NOW - 10)
    decision = decide(managed(), [first, second], CONTEXT)
    assert decision.cancel == [second] and decision.mark["t2"] == {"state": JobState.CANCELLING,
                                                                    "reason": "duplicate of attempt 1"}
    assert decision.note == "attempts 1, 2 both started; kept attempt 1"
    assert decision.state is ManagedState.RUNNING and decision.reason == "on slurm/alpine/gpu (attempt 1)"
    assert decision.running_on == "alpine"


def test_an_older_attempt_that_succeeded_ends_the_job_and_cancels_each_newer_one_once():
    old = attempt(1, JobState.SUCCEEDED, ended_at=NOW - 5)
    racing = attempt(2, JobState.RUNNING, "borealis", started_at=NOW - 30)
    newest = attempt(3, JobState.RUNNING, "cirrus", started_at=NOW - 10)
    decision = decide(managed(), [old, racing, newest], CONTEXT)
    assert decision.state is ManagedState.SUCCEEDED
    assert sorted(a.token for a in decision.cancel) == ["t2", "t3"]  # each once, though one was also a duplicate
    assert {token: fields["reason"] for token, fields in decision.mark.items()} == {
        "t2": "attempt 1 had already succeeded", "t3": "attempt 1 had already succeeded"}


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.RUNNING, JobState.SUBMITTING])
def test_an_attempt_on_a_cluster_unreachable_beyond_the_grace_is_recovered_elsewhere(state):
    context = Context(NOW, frozenset({"alpine"}), ControllerSettings(), CONTEXT.where)
    latest = attempt(1, state)
    assert decide(managed(), [latest], context).needs is Need.RECOVERY  # job_recovery is a store read
    decision = decide(managed(recoveries=2), [latest], context, known())
    assert decision.mark == {"t1": {"state": JobState.CANCELLING, "reason": "alpine unreachable for more than 60s"}}
    assert decision.state is ManagedState.RECOVERING and decision.fields == {"recoveries": 3}
    assert decision.place == "alpine unreachable for more than 60s" and decision.failed_on is None


def test_job_recovery_none_makes_an_infrastructure_failure_final():
    latest = attempt(1, JobState.FAILED, failure=FailureClass.INFRA, reason="NODE_FAIL", ended_at=NOW)
    decision = decide(managed(), [latest], CONTEXT, known(JobRecovery(strategy="none")))
    assert decision.state is ManagedState.FAILED and decision.place is None
    assert decision.reason == "attempt 1 on alpine: NODE_FAIL; not recovered (job_recovery: none)"
    assert decision.failed_on == "alpine"  # the cluster's failures in a row count it all the same


def test_an_infrastructure_failure_is_recovered_and_counted_against_its_cluster():
    latest = attempt(1, JobState.FAILED, failure=FailureClass.INFRA, reason="NODE_FAIL", started_at=NOW - 600,
                     ended_at=NOW)
    decision = decide(managed(), [latest], CONTEXT, known())
    assert decision.state is ManagedState.RECOVERING and decision.place == "attempt 1 on alpine: NODE_FAIL"
    assert decision.failed_on == "alpine" and decision.fields == {"recoveries": 1}


def test_attempts_the_infrastructure_ends_at_once_every_time_end_in_failed():
    limit = ControllerSettings().max_launch_failures
    attempts = [attempt(n, JobState.FAILED, failure=FailureClass.INFRA, started_at=NOW, ended_at=NOW + 1)
                for n in range(1, limit + 1)]
    decision = decide(managed(), attempts, CONTEXT)  # no fact needed: not recovered whatever job_recovery says
    assert decision.state is ManagedState.FAILED and decision.place is None
    assert f"its last {limit} attempts all ended as soon as they started" in (decision.reason or "")


def test_a_task_failure_asks_whether_setup_failed_before_anything_else():
    latest = attempt(1, JobState.FAILED, failure=FailureClass.TASK, exit_code=3)
    assert decide(managed(), [latest], CONTEXT).needs is Need.SETUP_FAILED
    assert decide(managed(), [latest], CONTEXT, Facts(frozenset({Need.SETUP_FAILED}))).needs is Need.RECOVERY
    failed_setup = decide(managed(), [latest], CONTEXT, Facts(frozenset({Need.SETUP_FAILED}), setup_failed=True))
    assert failed_setup.state is ManagedState.FAILED_SETUP and failed_setup.place is None


def test_a_task_failure_restarts_as_job_recovery_says_then_fails():
    latest = attempt(1, JobState.FAILED, failure=FailureClass.TASK, exit_code=3, reason="FAILED")
    recovery = JobRecovery(max_restarts_on_errors=2, recover_on_exit_codes=[75])
    restarted = decide(managed(restarts_on_errors=1), [latest], CONTEXT, known(recovery))
    assert restarted.state is ManagedState.RECOVERING and restarted.fields == {"restarts_on_errors": 2}
    assert restarted.reason == "exit code 3: restart 2 of 2" and restarted.place == "exit code 3"
    spent = decide(managed(restarts_on_errors=2), [latest], CONTEXT, known(recovery))
    assert spent.state is ManagedState.FAILED and spent.place is None
    listed = attempt(1, JobState.FAILED, failure=FailureClass.TASK, exit_code=75)
    always = decide(managed(restarts_on_errors=2), [listed], CONTEXT, known(recovery))
    assert always.state is ManagedState.RECOVERING and always.fields == {}  # listed codes do not spend restarts


def test_a_pending_attempt_may_move_only_once_it_has_waited():
    fresh = attempt(1, JobState.PENDING, submitted_at=NOW - 1, reason="Resources")
    waited = attempt(1, JobState.PENDING, submitted_at=NOW - 60, reason="Resources")
    assert decide(managed(), [fresh], CONTEXT).may_move is None
    decision = decide(managed(), [waited], CONTEXT)
    assert decision.may_move is waited and (decision.state, decision.reason) == (ManagedState.PENDING, "Resources")
    assert decide(managed(recoveries=1), [waited], CONTEXT).state is ManagedState.RECOVERING


def test_a_held_move_is_released_only_after_the_old_attempt_ended_and_the_fence_had_its_time():
    held = attempt(2, JobState.PENDING, "borealis", held=True)
    running_old = attempt(1, JobState.RUNNING)
    blocked = decide(managed(), [running_old, held], CONTEXT)
    assert blocked.release is None and blocked.reason == "attempt 2 held until attempt 1 is confirmed cancelled"
    just_ended = attempt(1, JobState.CANCELLED, ended_at=NOW - CANCEL_FENCE_SECONDS / 2)
    assert decide(managed(), [just_ended, held], CONTEXT).release is None
    long_ended = attempt(1, JobState.CANCELLED, ended_at=NOW - CANCEL_FENCE_SECONDS - 1)
    assert decide(managed(), [long_ended, held], CONTEXT).release is held


def test_an_attempt_replaced_by_a_move_leaves_the_job_as_it_is():
    moved_away = attempt(1, JobState.CANCELLED, reason="re-routed to borealis")
    decision = decide(managed(state=ManagedState.PENDING, reason="x"), [moved_away], CONTEXT)
    assert decision.state is None and not decision.cancel and decision.place is None
    by_hand = attempt(1, JobState.CANCELLED, reason=None)
    assert decide(managed(), [by_hand], CONTEXT).reason == "cancelled in Slurm"


@pytest.mark.parametrize("state", [JobState.SUBMITTING, JobState.CANCELLING])
def test_an_attempt_in_between_is_left_to_the_tracker(state):
    decision = decide(managed(), [attempt(1, state)], CONTEXT)
    assert decision.state is None and decision.place is None and decision.needs is None


# ---- where a pending job goes ---------------------------------------------------------------------
[OPTION] = resource_options(parse_task({"run": "x"}, "t").resources)


def place(cluster: str, now: bool = False, copies: int = 0, start: float | None = None) -> Candidate:
    return Candidate(cluster, "gpu", OPTION, True, startable_now=now, startable_copies=copies, predicted_start=start)


def test_a_job_its_own_cluster_can_start_now_stays():
    waiting = attempt(1, JobState.PENDING)
    assert starts_where_it_is(waiting, Plan([place("alpine", now=True, copies=1), place("borealis", now=True)]))
    assert not starts_where_it_is(waiting, Plan([place("alpine"), place("borealis", now=True)]))


def test_a_move_to_start_now_goes_where_capacity_is_left_after_this_tick_and_never_to_an_avoided_cluster():
    waiting = attempt(1, JobState.PENDING, reason="Resources")
    plan = Plan([place("alpine"), place("borealis", now=True, copies=1), place("cirrus", now=True, copies=4)])
    move = move_to_start_now(waiting, plan, {}, set())
    assert move is not None and move.place == ("borealis", "gpu")
    assert move.why == "re-routed to slurm/borealis/gpu: it can start now; alpine had it pending (Resources)"
    assert move_to_start_now(waiting, plan, {("borealis", "gpu"): 1}, set()).place == ("cirrus", "gpu")
    assert move_to_start_now(waiting, plan, {}, {"borealis", "cirrus"}) is None
    assert [c.startable_copies for c in after_taken(plan.feasible(), {("cirrus", "gpu"): 3})] == [1, 1, 0]


def test_a_predicted_move_needs_to_beat_the_current_start_by_the_margin():
    waiting = attempt(1, JobState.PENDING, expected_start=NOW + 3600)  # an hour away: the margin is 12 min
    barely = Plan([place("alpine", start=NOW + 3600), place("borealis", start=NOW + 3000)])  # 10 min sooner
    assert move_by_prediction(waiting, barely, set(), ControllerSettings(), NOW) is None
    clearly = Plan([place("alpine", start=NOW + 3600), place("borealis", start=NOW + 600)])  # 50 min sooner
    move = move_by_prediction(waiting, clearly, set(), ControllerSettings(), NOW)
    assert move is not None and move.place == ("borealis", "gpu") and "50 min sooner than on alpine" in move.why
    assert move_by_prediction(waiting, clearly, {"borealis"}, ControllerSettings(), NOW) is None
    unknown = attempt(1, JobState.PENDING, expected_start=None)  # no estimate here, from Slurm or the plan
    assert move_by_prediction(unknown, Plan([place("borealis", start=NOW)]), set(), ControllerSettings(), NOW) is None


# ---- every history of attempts --------------------------------------------------------------------
ATTEMPTS = st.lists(st.builds(
    lambda state, failure, held, cluster, started, ended, code, reason: (state, failure, held, cluster, started, ended,
                                                                          code, reason),
    st.sampled_from(list(JobState)), st.sampled_from([None, *FailureClass]), st.sampled_from([None, False, True]),
    st.sampled_from(["alpine", "borealis"]), st.one_of(st.none(), st.floats(NOW - 7200, NOW)),
    st.one_of(st.none(), st.floats(NOW - 7200, NOW)), st.one_of(st.none(), st.integers(-1, 255)),
    st.sampled_from([None, "Resources", "re-routed to x", "duplicate of attempt 1"])), max_size=6)


@settings(max_examples=300, deadline=None)
@given(history=ATTEMPTS, cancel=st.booleans(), recoveries=st.integers(0, 3), restarts=st.integers(0, 3),
       unreachable=st.sampled_from([frozenset(), frozenset({"alpine"})]), setup_failed=st.booleans(),
       recovery=st.sampled_from([None, JobRecovery(strategy="none"), JobRecovery(max_restarts_on_errors=2,
                                                                                 recover_on_exit_codes=[75])]))
def test_any_history_gets_a_consistent_decision_within_two_questions(history, cancel, recoveries, restarts,
                                                                     unreachable, setup_failed, recovery):
    attempts = [attempt(n, state, cluster, failure=failure, held=held, started_at=started, ended_at=ended,
                        exit_code=code, reason=reason)
                for n, (state, failure, held, cluster, started, ended, code, reason) in enumerate(history, 1)]
    m = managed(cancel_requested=cancel, recoveries=recoveries, restarts_on_errors=restarts)
    context = Context(NOW, unreachable, ControllerSettings(), CONTEXT.where)
    facts = Facts()
    for _ in range(3):
        decision = decide(m, attempts, context, facts)
        if decision.needs is None:
            break
        assert decision.needs not in facts.known  # a fact is asked for once
        fetched = {Need.RECOVERY: {"recovery": recovery}, Need.SETUP_FAILED: {"setup_failed": setup_failed}}
        facts = Facts(facts.known | {decision.needs}, **{"recovery": facts.recovery,
                                                          "setup_failed": facts.setup_failed,
                                                          **fetched[decision.needs]})
    assert decision.needs is None
    live = {a.token for a in attempts if a.state not in TERMINAL_STATES}
    assert {a.token for a in decision.cancel} <= live  # only what may still run is cancelled...
    assert len(decision.cancel) == len({a.token for a in decision.cancel})  # ...each once
    assert not (decision.place and decision.release)  # a new attempt, or the held one released: never both
    if cancel:
        assert decision.state is ManagedState.CANCELLED and {a.token for a in decision.cancel} == live
    # Whatever may still run the task is being stopped: cancelled now, or again each tick while CANCELLING.
    stopping = ({a.token for a in attempts if a.state == JobState.CANCELLING} | {a.token for a in decision.cancel}
                | {t for t, f in decision.mark.items() if f["state"] == JobState.CANCELLING})
    if decision.place:  # a new attempt only where no other may still run the task
        assert decision.state in (None, ManagedState.RECOVERING) and not cancel and live <= stopping
    if decision.state in MANAGED_TERMINAL_STATES:  # an ended job leaves nothing running
        assert decision.place is None and decision.release is None and live <= stopping


def test_a_newer_attempt_cancelled_as_a_duplicate_does_not_hide_the_fate_of_the_one_kept():
    """Two attempts started at once (a re-route race) and the older one, which started first, was kept:
    the job's state follows the kept attempt, not the newer duplicate."""
    kept = attempt(1, JobState.FAILED, failure=FailureClass.TASK, exit_code=3, started_at=NOW - 600, ended_at=NOW)
    duplicate = attempt(2, JobState.CANCELLED, "borealis", reason="duplicate of attempt 1", ended_at=NOW - 500)
    assert decide(managed(state=ManagedState.RUNNING), [kept, duplicate], CONTEXT).needs is Need.SETUP_FAILED
    decision = decide(managed(state=ManagedState.RUNNING), [kept, duplicate], CONTEXT, known())
    assert decision.state is ManagedState.FAILED and "attempt 1 failed" in (decision.reason or "")
    running = attempt(1, JobState.RUNNING, started_at=NOW - 600)
    assert decide(managed(), [running, duplicate], CONTEXT).state is ManagedState.RUNNING
