"""Launch, failover, sweeps, the tracker and the controller's recovery rule on an in-memory backend:
the code above the Infra seam works with any backend, and never reads a backend's words."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from corral.infra.base import CopiesCheckpoints, FailureClass, JobState, TakesFolderStreams
from corral.launch import Launcher
from corral.state import Store
from corral.task import parse_task
from corral.tracker import Tracker
from tests.fakes import FakeArrayInfra, FakeClient, FakeInfra
from tests.helpers import dead_leader_with_child, dead_tag
from tests.test_placement import SNAPSHOTS


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'state.db'}")


def fakes(kind=FakeInfra, **by_cluster) -> FakeClient:
    return FakeClient({name: kind(name, SNAPSHOTS[name], **by_cluster.get(name, {}))
                       for name in ("alpine", "borealis", "cirrus")})


def launch(client: FakeClient, store: Store, data: dict, num_jobs: int = 1):
    return asyncio.run(Launcher(client, store).launch(parse_task(data, "t"), "t", num_jobs=num_jobs))


def test_a_refusal_fails_over_to_the_next_candidate_and_is_classed_rejected(store):
    client = fakes(alpine={"refuse": {"gpu"}})  # alpine's gpu partition ranks first for H100:2 (free now)
    [share] = launch(client, store, {"resources": {"accelerators": "H100:2"}, "run": "true"})
    attempts = store.attempts_of(share.job_ids)[share.job_ids[0]]
    assert [(a.cluster, a.state, a.failure) for a in attempts] == [
        ("alpine", "SUBMIT_FAILED", "rejected"), ("borealis", "PENDING", None)]
    assert attempts[0].reason == "alpine: fake refuses gpu"
    assert attempts[1].handle == share.handle and share.tries == [("slurm/alpine/gpu", attempts[0].reason)]
    # The request the backend got is generic: the place, and the accelerator as that place spells it.
    [request] = client.infras["borealis"].requests
    assert (request.place, request.accelerator_type, request.accelerators_per_node) == ("h100-cluster", "H100", 2)


def test_an_unreachable_infra_is_skipped_with_all_its_places_and_classed_lost(store):
    client = fakes()
    plan_client = fakes()
    [share] = launch(plan_client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    assert share.cluster == "cirrus"  # the only place with B300s
    # Now cirrus stops answering after the probe: the submission is lost, and nothing else can take it.
    client.infras["cirrus"].unreachable = True
    client.probe = plan_client.probe  # the probe still saw it
    from corral.launch import LaunchFailedError

    with pytest.raises(LaunchFailedError, match="cirrus: login node refused the connection"):
        launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    lost = [a for attempts in store.attempts_of([v.job.id for v in store.views()]).values() for a in attempts
            if a.state == "SUBMIT_FAILED"]
    assert [a.failure for a in lost] == ["lost"]


def test_a_sweep_is_split_into_arrays_no_larger_than_the_infra_allows(store):
    client = fakes(FakeArrayInfra)
    shares = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"}, num_jobs=7)
    assert [len(s.job_ids) for s in shares] == [3, 3, 1]
    assert shares[0].handles == [f"{shares[0].handle}.{i}" for i in range(3)]
    recorded = {a.job_id: a.handle for attempts in store.attempts_of(
        [j for s in shares for j in s.job_ids]).values() for a in attempts}
    assert sorted(recorded.values()) == sorted(h for s in shares for h in s.handles)


def test_without_arrays_each_copy_is_its_own_submission(store):
    client = fakes()
    shares = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"}, num_jobs=4)
    assert [len(s.job_ids) for s in shares] == [1, 1, 1, 1]
    assert len(client.infras["cirrus"].requests) == 4


def test_the_tracker_records_the_failure_class_the_infra_reports(store):
    from corral.controller.rules import infra_failure

    client = fakes()
    [share] = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    infra = client.infras["cirrus"]
    infra.finish(share.handle, JobState.FAILED, FailureClass.INFRA, native="NODE_FAIL")
    asyncio.run(Tracker(client, store).refresh())
    [attempt] = store.attempts_of(share.job_ids)[share.job_ids[0]]
    assert (attempt.state, attempt.failure, attempt.reason) == ("FAILED", "infra", "NODE_FAIL")
    assert infra_failure(attempt)  # the controller recovers it: its rule reads the class, not the word
    [other] = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    infra.finish(other.handle, JobState.FAILED, FailureClass.TASK, native="OUT_OF_MEMORY")
    asyncio.run(Tracker(client, store).refresh())
    [attempt] = store.attempts_of(other.job_ids)[other.job_ids[0]]
    assert (attempt.failure, attempt.reason) == ("task", "OUT_OF_MEMORY") and not infra_failure(attempt)


def test_cancel_and_logs_go_through_the_seam(store):
    client = fakes()
    [share] = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    tracker = Tracker(client, store)
    view = store.resolve(share.job_ids[0])
    out: list[bytes] = []
    asyncio.run(tracker.logs(view, False, out.append))
    assert out == [f"log of {share.handle}\n".encode()]
    assert asyncio.run(tracker.cancel([view])) == [view]
    assert client.infras["cirrus"].cancelled == [share.handle]
    assert store.resolve(share.job_ids[0]).attempt.state == "CANCELLED"


def test_a_moved_attempt_that_ran_after_all_ends_the_job_and_no_other_attempt_runs(store):
    """A re-route's kill can be lost while Slurm launches the old attempt. The old attempt stays
    CANCELLING and watched; when it is seen to have succeeded, the job is done and the new attempt
    is cancelled before it can run the task a second time."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings
    from corral.state.models import AttemptRow

    client = fakes()
    [job_id] = managed.record(store, parse_task({"resources": {"accelerators": "B300:8"}, "run": "true"}, "t"),
                              "t")
    controller = Controller(client, store, "test", ControllerSettings())
    assert asyncio.run(controller.tick()).submitted == 1
    [first] = store.attempts_of([job_id])[job_id]
    cirrus = client.infras["cirrus"]
    # What a move leaves: the old attempt CANCELLING, a new attempt pending (here on the same infra).
    store.update_attempt(first.token, state="CANCELLING", reason="re-routed to slurm/cirrus/b300")
    store.add_jobs([], [AttemptRow(token="moved0000001", job_id=job_id, number=2, cluster="cirrus",
                                   partition="b300", state="PENDING", created_at=first.created_at + 1,
                                   run_dir="runs/moved", log_path="runs/moved/log-0", handle="777")])
    from tests.fakes import status

    cirrus.jobs["777"] = status("777", "moved0000001", JobState.PENDING)
    cirrus.finish(first.handle, JobState.SUCCEEDED)  # the lost kill: it ran to the end
    asyncio.run(controller.tick())
    [view] = managed.views(store, [job_id])
    assert view.managed.state == "SUCCEEDED" and "attempt 1 succeeded" in view.managed.reason
    assert [(a.number, a.state) for a in view.attempts] == [(1, "SUCCEEDED"), (2, "CANCELLED")]
    assert "777" in cirrus.cancelled


def test_a_moved_attempt_stays_watched_until_slurm_says_it_ended(store):
    from corral.state.models import AttemptRow

    client = fakes()
    [share] = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    [attempt] = store.attempts_of(share.job_ids)[share.job_ids[0]]
    store.update_attempt(attempt.token, state="CANCELLING", reason="re-routed to slurm/borealis/h100")
    asyncio.run(Tracker(client, store).refresh())  # Slurm still shows it pending: still CANCELLING
    assert store.resolve(share.job_ids[0]).attempt.state == "CANCELLING"
    client.infras["cirrus"].finish(share.handle, JobState.CANCELLED)
    asyncio.run(Tracker(client, store).refresh())
    settled: AttemptRow = store.resolve(share.job_ids[0]).attempt
    assert (settled.state, settled.reason) == ("CANCELLED", "re-routed to slurm/borealis/h100")


def test_a_job_cancelled_while_its_submission_is_unanswered_is_cancelled_once_the_cluster_shows_it(store):
    """sbatch accepted the job but its answer is not in yet (or was lost): the user's cancel has no id to
    send. The attempt is not recorded CANCELLED while the job may run; it is found by its token and
    cancelled there."""
    from corral.controller.engine import Controller, ControllerSettings
    from corral.liveness import process_tag
    from corral.state.models import AttemptRow, JobRow
    from tests.fakes import status

    client = fakes()
    store.add_jobs([JobRow(id="c-x", name="t", task_json="{}", created_at=1e12)],
                   [AttemptRow(token="tok-x", job_id="c-x", number=1, cluster="cirrus", partition="b300",
                               state="SUBMITTING", created_at=1e12, run_dir="r", log_path="l",
                               submitter=process_tag())])
    cirrus = client.infras["cirrus"]
    assert [v.job.id for v in asyncio.run(Tracker(client, store).cancel([store.resolve("c-x")]))] == ["c-x"]
    assert store.resolve("c-x").attempt.state == "CANCELLING" and cirrus.cancelled == []
    cirrus.jobs["77"] = status("77", "tok-x", JobState.RUNNING)  # the submission had got there after all
    controller = Controller(client, store, "test", ControllerSettings())
    asyncio.run(controller.tick())  # the refresh finds it by its token; the cancel goes out
    assert cirrus.cancelled == ["77"]
    asyncio.run(controller.tick())
    settled = store.resolve("c-x").attempt
    assert (settled.handle, settled.state, settled.reason) == ("77", "CANCELLED", "cancelled by user")
    # One that never got there is settled once nothing can still be sending it: cancelled, as asked.
    store.add_jobs([JobRow(id="c-y", name="t", task_json="{}", created_at=1e12)],
                   [AttemptRow(token="tok-y", job_id="c-y", number=1, cluster="cirrus", partition="b300",
                               state="SUBMITTING", created_at=1e12, run_dir="r", log_path="l", submitter=dead_tag())])
    asyncio.run(Tracker(client, store).cancel([store.resolve("c-y")]))
    assert store.resolve("c-y").attempt.state == "CANCELLING"
    asyncio.run(Tracker(client, store).refresh())
    never = store.resolve("c-y").attempt
    assert (never.handle, never.state, never.reason) == (None, "CANCELLED", "cancelled by user")


def test_a_submission_whose_submitter_died_is_settled_at_once_not_after_the_grace(store):
    from corral.liveness import process_tag
    from corral.state.models import AttemptRow, JobRow

    client = fakes()
    store.add_jobs([JobRow(id=f"c-{n}", name="t", task_json="{}", created_at=1e12) for n in ("dead", "alive")],
                   [AttemptRow(token=f"tok-{n}", job_id=f"c-{n}", number=1, cluster="cirrus", partition="b300",
                               state="SUBMITTING", created_at=9e11 + 1e11, run_dir="r", log_path="l",
                               submitter=tag) for n, tag in (("dead", dead_tag()), ("alive", process_tag()))])
    asyncio.run(Tracker(client, store).refresh())
    dead, alive = store.resolve("c-dead").attempt, store.resolve("c-alive").attempt
    assert (dead.state, dead.failure) == ("SUBMIT_FAILED", "lost")
    assert alive.state == "SUBMITTING"  # its submitter may still be sending it: the grace applies


def test_a_dead_submitter_whose_ssh_clients_still_run_is_not_settled_until_they_end(store):
    """A killed server's `ssh … sbatch` goes on and may still get the job to Slurm: its attempt waits for
    it (found by its token then), and is settled on the first refresh after it ended."""
    from corral.state.models import AttemptRow, JobRow

    client = fakes()
    with dead_leader_with_child() as (tag, end_child):
        store.add_jobs([JobRow(id="c-x", name="t", task_json="{}", created_at=1e12)],
                       [AttemptRow(token="tok-x", job_id="c-x", number=1, cluster="cirrus", partition="b300",
                                   state="SUBMITTING", created_at=1e12, run_dir="r", log_path="l", submitter=tag)])
        asyncio.run(Tracker(client, store).refresh())
        assert store.resolve("c-x").attempt.state == "SUBMITTING"  # its ssh may still be running sbatch
        end_child()
        asyncio.run(Tracker(client, store).refresh())
    assert (store.resolve("c-x").attempt.state, store.resolve("c-x").attempt.failure) == ("SUBMIT_FAILED", "lost")


def test_a_job_found_only_in_part_is_never_adopted_and_is_cancelled_once_its_attempt_is_settled(store):
    """A multi-node pool task some of whose ranks never started (its server killed half-way, or another
    replica still starting the last one): while its attempt may still be sent it is left alone, not
    adopted with a handle that misses ranks; once the attempt is settled as never sent, the ranks found
    are cancelled, and the attempt keeps no handle."""
    import dataclasses

    from corral.liveness import process_tag
    from corral.state.models import AttemptRow, JobRow
    from tests.fakes import status

    client = fakes()
    cirrus = client.infras["cirrus"]
    partial = "lab1,-/tok-p"
    cirrus.jobs[partial] = dataclasses.replace(status(partial, "tok-p", JobState.RUNNING), partial=True)
    store.add_jobs([JobRow(id="c-p", name="t", task_json="{}", created_at=time.time())],
                   [AttemptRow(token="tok-p", job_id="c-p", number=1, cluster="cirrus", partition="b300",
                               state="SUBMITTING", created_at=time.time(), run_dir="r", log_path="l",
                               submitter=process_tag())])
    asyncio.run(Tracker(client, store).refresh())
    attempt = store.resolve("c-p").attempt
    assert (attempt.state, attempt.handle) == ("SUBMITTING", None) and cirrus.cancelled == []
    store.update_attempt("tok-p", state="SUBMIT_FAILED", failure="lost", ended_at=time.time(),
                         reason="interrupted before Slurm accepted the job")
    asyncio.run(Tracker(client, store).refresh())
    assert cirrus.cancelled == [partial]
    attempt = store.resolve("c-p").attempt
    assert (attempt.state, attempt.handle) == ("SUBMIT_FAILED", None)
    assert "cirrus had part of the job after all" in attempt.reason


class HeldFiles:
    """Fake clusters whose copy of a task's files waits until the test lets it go (`released`), as a large
    one takes long: `begun` is set once the copy has begun (its attempt recorded, SUBMITTING). With
    `in_submit`, the wait is in the submission proper instead, where an SSH pool copies the files; with
    `failure`, the copy raises it once let go."""

    def __init__(self, in_submit: bool = False, failure: Exception | None = None) -> None:
        self.begun, self.released = asyncio.Event(), asyncio.Event()
        this = self

        class HeldUpload(FakeInfra):
            async def upload(self, local, remote, token=None):
                if not in_submit:
                    await this.held()
                await super().upload(local, remote, token)

            async def submit(self, request):
                if in_submit:
                    await this.held()
                return await super().submit(request)

        self.client = fakes(HeldUpload)
        self.failure = failure

    async def held(self) -> None:
        self.begun.set()
        await self.released.wait()
        if self.failure is not None:
            raise self.failure

    async def copying(self) -> None:
        await asyncio.wait_for(self.begun.wait(), 10)


class SlowSending:
    """A launch whose workdir copy is held (`HeldFiles`) until `accepted()` lets it go."""

    def __init__(self, store: Store, workdir, in_submit: bool = False) -> None:
        self.files = HeldFiles(in_submit)
        self.client = self.files.client
        task = parse_task({"resources": {"accelerators": "H100:1"}, "workdir": str(workdir), "run": "true"}, "t")
        self.launching = asyncio.create_task(Launcher(self.client, store).launch(task, "t"))

    async def copying(self) -> None:
        await self.files.copying()

    async def accepted(self):
        self.files.released.set()
        [share] = await self.launching
        return share


@pytest.mark.parametrize("in_submit", [False, True], ids=["upload", "in-submit"])
def test_an_attempt_whose_files_take_long_to_send_is_not_settled_meanwhile(store, tmp_path, monkeypatch,
                                                                           in_submit):
    """The grace counted from when the attempt was recorded, before its workdir is sent: a large workdir
    must not make a refresh call the attempt never sent (and a managed job's next attempt run beside it)
    while this process is still sending it; and the attempt is restamped while it is sent, so that
    another replica's grace counts from the latest restamp, also where the copy is part of the
    submission proper (an SSH pool's)."""
    from corral import launch, tracker
    from tests.test_tracker import until

    monkeypatch.setattr(tracker, "SUBMIT_GRACE_SECONDS", -1)  # every attempt is past the grace
    monkeypatch.setattr(launch, "RESTAMP_AFTER_SECONDS", 0.01)

    async def scenario() -> None:
        slow = SlowSending(store, tmp_path, in_submit=in_submit)
        await slow.copying()
        await Tracker(slow.client, store).refresh()
        [view] = store.queue_page().views
        assert view.attempt.state == "SUBMITTING"  # not SUBMIT_FAILED: its files are still being sent
        # Another replica's grace counts from the latest restamp, made while the files are on their way.
        await until(lambda: store.resolve(view.job.id).attempt.created_at > view.attempt.created_at)
        share = await slow.accepted()
        [attempt] = store.attempts_of(share.job_ids)[share.job_ids[0]]
        assert (attempt.state, attempt.handle) == ("PENDING", share.handle)
        assert asyncio.all_tasks() == {asyncio.current_task()}  # the restamps ended with the submission

    asyncio.run(scenario())


def test_a_job_cancelled_while_its_files_are_sent_is_cancelled_once_accepted(store, tmp_path):
    """`corral cancel` while the submission is still sending the workdir: the accepted answer does not
    undo the cancel (the attempt stays CANCELLING, with its handle), and the next tick cancels the job
    where it landed."""
    from corral.controller.engine import Controller, ControllerSettings

    async def scenario() -> None:
        slow = SlowSending(store, tmp_path)
        await slow.copying()
        [view] = store.queue_page().views
        assert [v.job.id for v in await Tracker(slow.client, store).cancel([view])] == [view.job.id]
        share = await slow.accepted()
        [attempt] = store.attempts_of(share.job_ids)[share.job_ids[0]]
        assert (attempt.state, attempt.handle) == ("CANCELLING", share.handle)
        await Controller(slow.client, store, "test", ControllerSettings()).tick()
        assert slow.client.infras[share.cluster].cancelled == [share.handle]

    asyncio.run(scenario())


def test_a_slow_submission_runs_beside_the_ticks_which_track_the_other_jobs_meanwhile(store, tmp_path):
    """A managed job whose files take long to send (a large workdir or checkpoint) no longer holds up
    the tick: it waits `submit_wait`, then the submission goes on beside the next ticks, which track the
    other jobs, never place that job again, and keep its home cluster leased; it is reported once it ends."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    async def scenario() -> None:
        files = HeldFiles()
        client = files.client
        slow_task = {"resources": {"accelerators": "B300:8"}, "workdir": str(tmp_path), "run": "true"}
        [slow] = managed.record(store, parse_task(slow_task, "t"), "t")
        [quick] = managed.record(store, parse_task({"resources": {"accelerators": "B300:8"}, "run": "true"}, "t"),
                                 "t")
        controller = Controller(client, store, "test", ControllerSettings(submit_wait=0.05))
        first = await controller.tick()
        assert files.begun.is_set() and (first.submitted, first.submitting) == (1, 1)
        assert controller.submitting_homes() and controller.submitting_homes() <= set(controller.shards.held)
        [quick_attempt] = store.attempts_of([quick])[quick]
        client.infras["cirrus"].finish(quick_attempt.handle, JobState.SUCCEEDED)
        second = await controller.tick()  # the quick job is tracked while the slow one is still sending
        assert {v.job.id: v.managed.state for v in managed.views(store)}[quick] == "SUCCEEDED"
        assert (second.submitted, second.submitting) == (0, 1)
        [attempt] = store.attempts_of([slow])[slow]  # not placed again
        assert attempt.state == "SUBMITTING"
        managed.request_cancel(store, [slow])  # takes effect once its submission has ended
        files.released.set()
        third = await controller.tick()
        assert (third.submitted, third.submitting) == (1, 0) and not controller.submitting_homes()
        [attempt] = store.attempts_of([slow])[slow]
        assert attempt.handle is not None
        assert len(client.infras["cirrus"].requests) == 2  # each job submitted once
        await controller.tick()
        assert client.infras["cirrus"].cancelled == [attempt.handle]

    asyncio.run(scenario())


def test_a_submission_that_fails_unexpectedly_after_its_tick_fails_the_next_tick_once(store, tmp_path):
    """A bug (not a cluster's refusal) in a submission that outlasted its tick is not lost unsaid: the
    tick that sees it end raises it, as the tick that ran it would have, and only that one."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    async def scenario() -> None:
        files = HeldFiles(failure=RuntimeError("a bug in the copy"))
        client = files.client
        task = {"resources": {"accelerators": "B300:8"}, "workdir": str(tmp_path), "run": "true"}
        managed.record(store, parse_task(task, "t"), "t")
        controller = Controller(client, store, "test", ControllerSettings(submit_wait=0.01))
        assert (await controller.tick()).submitting == 1
        files.released.set()
        with pytest.raises(RuntimeError, match="a bug in the copy"):
            await controller.tick()
        assert (await controller.tick()).submitting == 0

    asyncio.run(scenario())


def test_a_submission_answered_while_a_refresh_asks_is_not_settled_by_that_refresh(store, monkeypatch):
    """The refresh read the attempt without a handle, and past the grace; the launcher writes the answer
    while the status query runs (the job landed just after it). The refresh's settlement must not undo
    the answer."""
    from corral import tracker
    from corral.liveness import process_tag
    from corral.state.models import AttemptRow, JobRow

    monkeypatch.setattr(tracker, "SUBMIT_GRACE_SECONDS", -1)

    class AnsweredMeanwhile(FakeInfra):
        async def status(self, handles, accounts=(), *, others=True):
            seen = await super().status(handles, accounts, others=others)
            store.accept_attempts({"tok-x": "77"}, 1e12)  # the launcher's answer, written as the query ran
            return seen

    store.add_jobs([JobRow(id="c-x", name="t", task_json="{}", created_at=1e12)],
                   [AttemptRow(token="tok-x", job_id="c-x", number=1, cluster="cirrus", partition="b300",
                               state="SUBMITTING", created_at=1.0, run_dir="r", log_path="l",
                               submitter=process_tag())])
    asyncio.run(Tracker(fakes(AnsweredMeanwhile), store).refresh())
    attempt = store.resolve("c-x").attempt
    assert (attempt.state, attempt.handle) == ("PENDING", "77")


def test_jobs_a_dead_launch_recorded_without_attempts_become_visible_failures(store):
    import time

    from corral.state.models import JobRow

    client = fakes()
    store.add_jobs([JobRow(id=f"c-s{i}", name="sweep", task_json="{}", created_at=time.time(), job_rank=i,
                           num_jobs=3, sweep_id="c-s0", submitter=dead_tag()) for i in range(3)], [])
    assert store.queue_page().views == []  # invisible: no attempt
    asyncio.run(Tracker(client, store).refresh())
    shown = store.queue_page().views
    assert sorted(v.job.id for v in shown) == ["c-s0", "c-s1", "c-s2"]
    assert all(v.attempt.state == "SUBMIT_FAILED" and "interrupted before submitting" in v.attempt.reason
               for v in shown)


def moved(store, old_fate: JobState, ended_at: float | None = None):
    """A managed job on alpine, moved by the controller to borealis while the kill of its old
    attempt is lost; then Slurm reports the old attempt `old_fate`, and the controller ticks."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes()
    task = parse_task({"resources": {"accelerators": "H100:2"}, "run": "true"}, "t")
    [job_id] = managed.record(store, task, "t")
    controller = Controller(client, store, "test", ControllerSettings())
    asyncio.run(controller.tick())
    [m] = store.managed([job_id])
    [old] = store.attempts_of([job_id])[job_id]
    assert old.cluster == "alpine"
    plan = asyncio.run(controller.launcher.plan(task, predict="never"))
    target = next(c for c in plan.feasible() if c.cluster == "borealis")
    client.infras["alpine"].lose_kills = True
    assert asyncio.run(controller._move(m, store.jobs([job_id])[job_id], old, task, target, old.number + 1,
                                        "re-routed (test)")) == 1
    old_now, new = store.attempts_of([job_id])[job_id]
    assert (old_now.state, new.held, client.infras["borealis"].requests[-1].held) == ("CANCELLING", True, True)
    asyncio.run(controller.tick())  # Slurm still shows the old attempt: the new one stays held
    assert client.infras["borealis"].released == [] and store.attempts_of([job_id])[job_id][1].held
    client.infras["alpine"].finish(old.handle, old_fate, ended_at=ended_at)
    asyncio.run(controller.tick())
    return client, managed.views(store, [job_id])[0], new, controller


def test_a_move_is_released_once_the_old_attempt_is_confirmed_cancelled(store):
    client, view, new, _ = moved(store, JobState.CANCELLED)
    assert client.infras["borealis"].released == [new.handle]
    assert [(a.state, bool(a.held)) for a in view.attempts] == [("CANCELLED", False), ("PENDING", False)]


def test_a_move_is_released_only_once_the_task_side_cancel_fence_has_had_its_time(store):
    """Slurm can call an attempt cancelled while its task runs on (a kill that missed a task being
    launched); the task's own fence ends it within a second, so the replacement waits a little longer."""
    import time

    from corral.controller.rules import CANCEL_FENCE_SECONDS

    client, view, new, controller = moved(store, JobState.CANCELLED, ended_at=time.time())
    assert client.infras["borealis"].released == [] and view.attempts[1].held
    assert "held until attempt 1" in view.managed.reason
    old = view.attempts[0]
    client.infras["alpine"].finish(old.handle, JobState.CANCELLED,
                                   ended_at=time.time() - CANCEL_FENCE_SECONDS - 1)
    store.update_attempt(old.token, ended_at=time.time() - CANCEL_FENCE_SECONDS - 1)
    asyncio.run(controller.tick())
    assert client.infras["borealis"].released == [new.handle]


def test_a_move_whose_old_attempt_ran_after_all_is_never_released(store):
    client, view, new, _ = moved(store, JobState.SUCCEEDED)
    assert client.infras["borealis"].released == [] and new.handle in client.infras["borealis"].cancelled
    assert view.managed.state == "SUCCEEDED"
    assert [a.state for a in view.attempts] == ["SUCCEEDED", "CANCELLED"]


def test_separate_managed_jobs_placed_in_one_tick_share_each_places_free_capacity(store):
    """Jobs launched one by one and placed in the same tick are spread as one sweep of them would be:
    each sees what the ones before it took of a place's free capacity, instead of all going to the
    place that ranked first and waiting there."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings
    from corral.launch import split_sweep

    client = fakes()
    task = parse_task({"resources": {"cpus": 8}, "run": "true"}, "t")  # 1, 1, 2 and 1 can start now
    plan = asyncio.run(Launcher(client, store).plan(task, predict="never"))
    expected: dict[str, int] = {}
    for candidate, _first, count in split_sweep(plan.feasible(), 6):
        expected[candidate.cluster] = expected.get(candidate.cluster, 0) + count
    assert len(expected) > 1  # the first place cannot start all six now
    jobs = [managed.record(store, task, "t")[0] for _ in range(6)]
    assert asyncio.run(Controller(client, store, "test", ControllerSettings()).tick()).submitted == 6
    placed: dict[str, int] = {}
    for job in jobs:
        [attempt] = store.attempts_of([job])[job]
        placed[attempt.cluster] = placed.get(attempt.cluster, 0) + 1
    assert placed == expected


def test_a_job_the_infrastructure_fails_at_once_every_time_is_failed_not_recovered_forever(store):
    """A launch failure is recovered like a node failure, but one that follows the job everywhere (five
    attempts in a row ended as soon as they started) fails it, with why; a long run in between resets it."""
    import dataclasses

    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes()
    [job_id] = managed.record(store, parse_task({"resources": {"cpus": 1}, "run": "true"}, "t"), "t")
    controller = Controller(client, store, "test", ControllerSettings(unhealthy_after_failures=100))

    def fail_latest(ran_for: float = 0.0) -> None:
        latest = store.attempts_of([job_id])[job_id][-1]
        infra = client.infras[latest.cluster]
        infra.finish(latest.handle, JobState.FAILED, FailureClass.INFRA, native="JobLaunchFailure", ended_at=2000.0)
        infra.jobs[latest.handle] = dataclasses.replace(infra.jobs[latest.handle], started_at=2000.0 - ran_for)

    asyncio.run(controller.tick())
    fail_latest(ran_for=3600)  # a node failure after an hour's run: recovered, and not counted
    for _ in range(5):
        asyncio.run(controller.tick())
        [view] = managed.views(store, [job_id])
        assert view.managed.state != "FAILED"
        fail_latest()
    asyncio.run(controller.tick())
    [view] = managed.views(store, [job_id])
    assert [a.state for a in view.attempts] == ["FAILED"] * 6  # no seventh attempt
    assert view.managed.state == "FAILED"
    assert "not recovered again: its last 5 attempts all ended as soon as they started" in view.managed.reason


def test_one_probe_for_many_jobs_of_one_task_reads_the_tasks_alternatives_once(store, monkeypatch):
    """A tick probes for every job it places or may move (10,000 pending jobs of a sweep): their shared
    task's alternatives are expanded once, not once per job."""
    from corral import launch as launch_module

    calls = []
    expand = launch_module.resource_options
    monkeypatch.setattr(launch_module, "resource_options", lambda res: calls.append(res) or expand(res))
    task = parse_task({"resources": {"cpus": 1, "infra": "slurm/alpine"}, "run": "true"}, "t")
    other = parse_task({"resources": {"cpus": 2, "infra": "slurm/borealis"}, "run": "true"}, "t")
    outcomes = asyncio.run(Launcher(fakes(), store).probe_for([task] * 1000 + [other] * 1000))
    assert len(calls) == 2
    assert sorted(o.cluster for o in outcomes) == ["alpine", "borealis"]  # the pinned clusters, as before


def test_a_task_for_a_kind_with_no_place_asks_no_cluster_and_says_what_to_set_up(store):
    """`--infra k8s` without contexts had probed every Slurm cluster, and said why each could not run it."""
    from corral.launch import NoFeasibleClusterError

    client = fakes(alpine={"unreachable": True})
    task = parse_task({"resources": {"infra": "k8s"}, "run": "true"}, "t")
    launcher = Launcher(client, store)
    assert asyncio.run(launcher.probe_for([task])) == []  # nothing asked
    with pytest.raises(NoFeasibleClusterError, match=r"^no cluster can run this task:\n  infra k8s: no Kubernetes "
                                                     r"context is set up: list contexts under `kubernetes:"):
        launch(client, store, {"resources": {"infra": "k8s"}, "run": "true"})
    # either kind: the Slurm clusters are asked, and only the one that did not answer is named with the kind
    either = parse_task({"resources": {"any_of": [{"infra": "k8s"}, {"infra": "slurm/alpine"}]}, "run": "true"}, "t")
    assert [o.cluster for o in asyncio.run(launcher.probe_for([either]))] == ["alpine"]
    with pytest.raises(NoFeasibleClusterError) as refused:
        launch(client, store, {"resources": {"any_of": [{"infra": "k8s"}, {"infra": "slurm/alpine"}]}, "run": "true"})
    assert "slurm/alpine: " in str(refused.value) and "infra k8s: no Kubernetes context" in str(refused.value)
    assert "borealis" not in str(refused.value)


def test_an_attempt_left_on_a_cluster_that_was_down_is_cancelled_when_it_answers_even_after_the_job_ended(store):
    """A cluster unreachable beyond the grace: its attempt is marked CANCELLING and the job recovers
    elsewhere. If the job ends there before the cluster answers again, the old attempt must still be
    cancelled once it does, not left to run the task a second time."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes()
    task = parse_task({"resources": {"accelerators": "H100:2"}, "run": "true"}, "t")
    [job_id] = managed.record(store, task, "t")
    controller = Controller(client, store, "test", ControllerSettings(grace_seconds=0))
    asyncio.run(controller.tick())
    [old] = store.attempts_of([job_id])[job_id]
    alpine = client.infras["alpine"]
    assert old.cluster == "alpine"
    alpine.finish(old.handle, JobState.RUNNING)
    alpine.unreachable = True
    asyncio.run(controller.tick())  # seen unreachable (the grace starts)
    asyncio.run(controller.tick())  # beyond the grace: marked CANCELLING, recovered on borealis
    old_now, new = store.attempts_of([job_id])[job_id]
    assert (old_now.state, new.cluster) == ("CANCELLING", "borealis")
    client.infras["borealis"].finish(new.handle, JobState.SUCCEEDED)
    asyncio.run(controller.tick())
    assert store.managed([job_id])[0].state == "SUCCEEDED"
    alpine.unreachable = False  # back, and the old attempt still runs there
    asyncio.run(controller.tick())
    assert old.handle in alpine.cancelled
    asyncio.run(controller.tick())
    assert store.attempts_of([job_id])[job_id][0].state == "CANCELLED"


def test_a_cluster_not_asked_during_its_back_off_stays_unreachable_since_it_stopped_answering(store, monkeypatch):
    """A tick that defers a cluster (its controller backs off, or its budget is spent) learns nothing of
    it: the grace keeps counting from when it stopped answering. It restarted from zero at every
    deferred tick, so a cluster whose controller was down could put off its jobs' recovery forever."""
    from corral import budget, managed
    from corral.controller.engine import Controller, ControllerSettings

    monkeypatch.setattr(budget, "_BUDGETS", {})
    client = fakes()
    [job_id] = managed.record(store, parse_task({"resources": {"accelerators": "H100:2"}, "run": "true"}, "t"), "t")
    controller = Controller(client, store, "test", ControllerSettings(grace_seconds=3600))
    asyncio.run(controller.tick())
    [attempt] = store.attempts_of([job_id])[job_id]
    client.infras[attempt.cluster].unreachable = True
    asyncio.run(controller.tick())
    since = store.health()[attempt.cluster].unreachable_since
    assert since is not None
    budget.budget_for(attempt.cluster).answered("Unable to contact slurm controller (connect failure)")
    report = asyncio.run(controller.tick())
    assert "its Slurm controller is busy" in report.errors[attempt.cluster]  # not asked, and said so
    assert store.health()[attempt.cluster].unreachable_since == since
    allowance = budget.budget_for(attempt.cluster)
    allowance.busy_until = 0.0  # the back-off over, but the cluster's minute spent: deferred, without an error
    allowance.spend(allowance.per_minute)
    report = asyncio.run(controller.tick())
    assert attempt.cluster not in report.errors
    assert store.health()[attempt.cluster].unreachable_since == since


def test_a_managed_job_cancelled_while_its_cluster_is_down_is_cancelled_there_once_it_answers(store):
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes()
    [job_id] = managed.record(store, parse_task({"resources": {"accelerators": "H100:2"}, "run": "true"}, "t"), "t")
    controller = Controller(client, store, "test", ControllerSettings())
    asyncio.run(controller.tick())
    [attempt] = store.attempts_of([job_id])[job_id]
    alpine = client.infras[attempt.cluster]
    alpine.unreachable = True
    managed.request_cancel(store, [job_id])
    asyncio.run(controller.tick())
    assert store.managed([job_id])[0].state == "CANCELLED"
    assert store.attempts_of([job_id])[job_id][0].state == "CANCELLING" and alpine.cancelled == []
    alpine.unreachable = False
    asyncio.run(controller.tick())
    assert alpine.cancelled == [attempt.handle]
    asyncio.run(controller.tick())
    settled = store.attempts_of([job_id])[job_id][0]
    assert (settled.state, settled.reason) == ("CANCELLED", "cancelled by user")


def test_when_two_attempts_run_at_once_the_job_follows_the_one_kept(store):
    """A re-route race: the old attempt started, and so did its replacement. The one that started first
    is kept and the other cancelled as a duplicate; the job's fate is then the kept attempt's."""
    import time

    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings
    from corral.state.models import AttemptRow
    from tests.fakes import status

    client = fakes()
    [job_id] = managed.record(store, parse_task({"resources": {"accelerators": "H100:2"}, "run": "true"}, "t"), "t")
    controller = Controller(client, store, "test", ControllerSettings())
    asyncio.run(controller.tick())
    [first] = store.attempts_of([job_id])[job_id]
    alpine, borealis = client.infras["alpine"], client.infras["borealis"]
    store.add_jobs([], [AttemptRow(token="race00000002", job_id=job_id, number=2, cluster="borealis",
                                   partition="h100-cluster", state="PENDING", created_at=time.time(),
                                   run_dir="runs/race", log_path="runs/race/log-0", handle="900")])
    borealis.jobs["900"] = status("900", "race00000002", JobState.RUNNING)
    alpine.finish(first.handle, JobState.RUNNING)
    asyncio.run(controller.tick())
    assert borealis.cancelled == ["900"]
    asyncio.run(controller.tick())
    assert store.managed([job_id])[0].state == "RUNNING"
    alpine.finish(first.handle, JobState.FAILED, FailureClass.TASK)
    asyncio.run(controller.tick())
    [m] = store.managed([job_id])
    assert (m.state, m.reason) == ("FAILED", "attempt 1 failed (exit code None, FAILED)")
    assert [(a.state, a.reason) for a in store.attempts_of([job_id])[job_id]][1] == (
        "CANCELLED", "duplicate of attempt 1")


def test_a_tick_waits_for_a_slow_cluster_only_so_long_and_drives_the_jobs_elsewhere(store):
    """A slurmctld slow but alive (squeue up to its 30 s timeout) held up every tick, and with it the
    jobs on every other cluster. Now the tick waits `status_wait` at most; the slow cluster's jobs are
    as last seen, and its grace clock does not start: slow is not down."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings
    from tests.test_tracker import CountingSlowInfra, until

    client = fakes(kind=CountingSlowInfra)
    alpine, cirrus = client.infras["alpine"], client.infras["cirrus"]
    [on_alpine] = managed.record(store, parse_task({"resources": {"accelerators": "H100:2"}, "run": "true"}, "t"), "t")
    [on_cirrus] = managed.record(store, parse_task({"resources": {"accelerators": "B300:8"}, "run": "true"}, "t"), "t")
    controller = Controller(client, store, "test", ControllerSettings(status_wait=0.2, grace_seconds=0))

    def latest(job_id: str):
        return store.attempts_of([job_id])[job_id][-1]

    async def scenario() -> None:
        alpine.gate.set()
        cirrus.gate.set()
        await controller.tick()
        assert (latest(on_alpine).cluster, latest(on_cirrus).cluster) == ("alpine", "cirrus")
        await controller.tick()  # both queried once: cirrus has answered before
        cirrus.gate.clear()
        alpine.finish(latest(on_alpine).handle, JobState.SUCCEEDED)
        started = time.monotonic()
        report = await controller.tick()
        assert time.monotonic() - started < 2.0
        assert store.managed([on_alpine])[0].state == "SUCCEEDED"
        assert report.errors["cirrus"].startswith("no answer in ")
        # Slow, not down: with a grace of 0 it would otherwise be recovered elsewhere at once.
        assert store.health().get("cirrus") is None or store.health()["cirrus"].unreachable_since is None
        await controller.tick()
        assert len(store.attempts_of([on_cirrus])[on_cirrus]) == 1 and cirrus.queried == 2  # joined, not asked again
        cirrus.finish(latest(on_cirrus).handle, JobState.SUCCEEDED)
        cirrus.gate.set()
        await until(lambda: latest(on_cirrus).state == "SUCCEEDED")
        await controller.tick()
        assert store.managed([on_cirrus])[0].state == "SUCCEEDED"

    asyncio.run(scenario())


def test_a_tick_leaves_a_cluster_whose_status_query_has_not_answered_out_of_its_placement(store):
    """With cirrus' slurmctld frozen, every tick that placed a job probed cirrus too: 5 s for the first
    (its `scontrol ping` timeout), 1 s for each later one. A cluster whose status query has not answered
    in `status_wait` is now left out of the tick's placement, unless a job names it."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings
    from tests.test_tracker import CountingSlowInfra

    class ProbeCounting(CountingSlowInfra):
        probes = 0

        async def probe(self, **asked):
            self.probes += 1
            return await super().probe(**asked)

    client = fakes(kind=ProbeCounting)
    for infra in client.infras.values():
        infra.gate.set()
    cirrus = client.infras["cirrus"]
    controller = Controller(client, store, "test", ControllerSettings(status_wait=0.2))

    def record(resources: dict) -> str:
        [job_id] = managed.record(store, parse_task({"resources": resources, "run": "true"}, "t"), "t")
        return job_id

    def attempts(job_id: str):
        return store.attempts_of([job_id]).get(job_id, [])

    async def scenario() -> None:
        on_cirrus = record({"accelerators": "B300:8"})  # only cirrus has B300s
        await controller.tick()
        assert [a.cluster for a in attempts(on_cirrus)] == ["cirrus"]
        cirrus.gate.clear()
        anywhere = record({"accelerators": "B300:8"})
        probes = cirrus.probes
        await controller.tick()
        assert cirrus.probes == probes and attempts(anywhere) == []
        reason = store.managed([anywhere])[0].reason
        assert "cirrus: its status query has had no answer in " in reason and "left out of placement" in reason, reason
        cirrus.gate.set()  # it answers: the next tick places there again
        await controller.tick()
        assert [a.cluster for a in attempts(anywhere)] == ["cirrus"] and cirrus.probes == probes + 1
        cirrus.gate.clear()
        named = record({"accelerators": "B300:8", "infra": "slurm/cirrus"})
        await controller.tick()
        assert cirrus.probes == probes + 2  # a job that names it asks it all the same
        assert [a.cluster for a in attempts(named)] == ["cirrus"]
        cirrus.gate.set()

    asyncio.run(scenario())


def counted_pipeline_reads(store: Store) -> list[list[str]]:
    """The pipeline ids of each store read of pipeline rows, as the store is asked from now on."""
    reads: list[list[str]] = []
    original = store.pipeline_tasks

    def counted(pipeline_ids):
        reads.append(sorted(set(pipeline_ids := list(pipeline_ids))))
        return original(pipeline_ids)

    store.pipeline_tasks = counted
    return reads


def test_a_pipelines_tasks_run_one_after_another_and_a_failure_skips_the_rest(store):
    """A task starts on the tick its predecessor succeeds (decided in the order they run), never before;
    a task that fails skips every task after it; and the predecessors are read in one store query."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes()
    tasks = [(parse_task({"name": name, "resources": {"cpus": 1}, "run": "true"}, "t"), "t")
             for name in ("prep", "train", "eval")]
    ids = managed.record_pipeline(store, "pipe", tasks)
    controller = Controller(client, store, "test", ControllerSettings())
    reads = counted_pipeline_reads(store)

    def state(job_id):
        [view] = managed.views(store, [job_id])
        return view.managed.state, len(view.attempts), view.managed.reason

    def finish(job_id, fate, failure=None):
        latest = store.attempts_of([job_id])[job_id][-1]
        client.infras[latest.cluster].finish(latest.handle, fate, failure, ended_at=2000.0)

    asyncio.run(controller.tick())
    assert state(ids[0])[:2] == ("PENDING", 1)
    assert state(ids[1]) == ("PENDING", 0, f"waiting for the pipeline's task 0 ({ids[0]}) to succeed")
    assert state(ids[2]) == ("PENDING", 0, f"waiting for the pipeline's task 1 ({ids[1]}) to succeed")
    assert reads == [[ids[0]]]  # both waiting tasks' predecessors: one query
    asyncio.run(controller.tick())
    assert state(ids[1])[1] == 0  # the first task still runs: nothing more starts
    finish(ids[0], JobState.SUCCEEDED)
    asyncio.run(controller.tick())
    assert state(ids[0])[0] == "SUCCEEDED"
    assert state(ids[1])[:2] == ("PENDING", 1)  # on the same tick
    assert state(ids[2])[1] == 0
    finish(ids[1], JobState.FAILED, FailureClass.TASK)
    for _ in range(2):
        asyncio.run(controller.tick())
    assert state(ids[1])[0] == "FAILED"
    assert state(ids[2]) == ("CANCELLED", 0, f"skipped: the pipeline's task 1 ({ids[1]}) ended FAILED")
    reads.clear()
    asyncio.run(controller.tick())
    assert reads == []  # nothing is live any more: no pipeline read
    assert [v.job.id for v in managed.resolve_all(store, "pipe")] == ids
    assert managed.resolve(store, "pipe").job.id == ids[0]


def test_a_job_group_runs_side_by_side_on_one_cluster_and_its_auxiliary_task_stops_after_the_primary(store):
    """A job group's tasks are placed on the same tick, on the one cluster that can run all of them
    (the trainer alone would start sooner on alpine); once the primary task ends, the auxiliary one is
    cancelled there; and the group's rows are read in one store query per tick."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes()
    tasks = [(parse_task({"name": name, "resources": {"accelerators": gpus}, "run": "true"}, "t"), "t")
             for name, gpus in (("trainer", "H100:1"), ("server", "L40S:1"))]
    alone = asyncio.run(Launcher(client, store).plan(tasks[0][0], predict="never")).feasible()[0]
    assert alone.cluster == "alpine"
    ids = managed.record_pipeline(store, "grp", tasks, parallel=True, primary_tasks=["trainer"])
    controller = Controller(client, store, "test", ControllerSettings())
    reads = counted_pipeline_reads(store)
    assert asyncio.run(controller.tick()).submitted == 2
    placed = {job: store.attempts_of([job])[job][-1] for job in ids}
    assert {a.cluster for a in placed.values()} == {"borealis"}
    assert reads == [[ids[0]]]  # the auxiliary task's primaries: one query
    env = {r.extra_env["CORRAL_JOBGROUP_TASK"]: r.extra_env for r in client.infras["borealis"].requests}
    assert env["server"]["SKYPILOT_JOBGROUP_NAME"] == "grp" and env["trainer"]["CORRAL_PIPELINE_ID"] == ids[0]
    for job in ids:
        client.infras["borealis"].finish(placed[job].handle, JobState.RUNNING)
    asyncio.run(controller.tick())
    assert [v.managed.state for v in managed.views(store, ids)] == ["RUNNING", "RUNNING"]
    # the trainer's node fails: it is recovered on its group's cluster, not on alpine, where it alone would go
    client.infras["borealis"].finish(placed[ids[0]].handle, JobState.FAILED, FailureClass.INFRA)
    asyncio.run(controller.tick())
    recovered = store.attempts_of([ids[0]])[ids[0]]
    assert [(a.number, a.cluster) for a in recovered] == [(1, "borealis"), (2, "borealis")]
    rounds = [r.extra_env["CORRAL_JOBGROUP_ROUND"] for r in client.infras["borealis"].requests]
    assert len(rounds) == 3 and len(set(rounds)) == 1  # the recovered trainer joins its group's round
    placed[ids[0]] = recovered[-1]
    client.infras["borealis"].finish(placed[ids[0]].handle, JobState.RUNNING)
    client.infras["borealis"].finish(placed[ids[0]].handle, JobState.SUCCEEDED, ended_at=2000.0)
    asyncio.run(controller.tick())  # the trainer ends, and the server is stopped on the same tick
    [trainer, server] = managed.views(store, ids)
    assert trainer.managed.state == "SUCCEEDED"
    assert server.managed.state == "CANCELLED"
    assert server.managed.reason == f"stopped: the job group's primary tasks have ended ({ids[0]} SUCCEEDED)"
    assert placed[ids[1]].handle in client.infras["borealis"].cancelled
    reads.clear()
    asyncio.run(controller.tick())
    assert reads == []  # nothing is live: no group read


def test_a_job_group_goes_only_where_its_tasks_can_find_each_other(store):
    """A place whose infra cannot run a job group (no CORRAL_JOBGROUP_HOSTS there, or a pool whose homes
    are apart) is left out of the group's plan with its reason; the group goes to one that can, and a
    task alone still goes there."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes()
    client.infras["borealis"].groups_refused = "its machines do not share one home"
    tasks = [(parse_task({"name": name, "resources": {"accelerators": "L40S:1"}, "run": "true"}, "t"), "t")
             for name in ("trainer", "server")]
    alone = asyncio.run(Launcher(client, store).plan(tasks[0][0], predict="never")).feasible()
    assert [c.cluster for c in alone] == ["borealis"]
    grouped = asyncio.run(Launcher(client, store).plan(tasks[0][0], predict="never", grouped=True))
    assert grouped.feasible() == []
    assert "its machines do not share one home" in {c.reason for c in grouped.candidates if c.cluster == "borealis"}
    ids = managed.record_pipeline(store, "grp", tasks, parallel=True)
    controller = Controller(client, store, "test", ControllerSettings())
    assert asyncio.run(controller.tick()).submitted == 0
    for view in managed.views(store, ids):  # the place the group's resources fit, first among the reasons
        assert view.managed.state == "PENDING"
        assert view.managed.reason.startswith("no cluster can run every task of its job group now: ")
        reason = view.managed.reason.split(": ", 2)[2]  # past the task's name
        assert reason.startswith("slurm/borealis/l40s: its machines do not share one home; "), reason
    client.infras["borealis"].groups_refused = None
    assert asyncio.run(controller.tick()).submitted == 2


def test_a_job_group_whose_cluster_is_lost_moves_whole_to_one_that_can_run_it(store):
    """Its cluster unreachable beyond the grace: every task is recovered, together, on one other
    cluster (they had waited for the lost one for good); the old attempts are cancelled once it
    answers again."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes()
    tasks = [(parse_task({"name": name, "resources": {"accelerators": "H100:1"}, "run": "true"}, "t"), "t")
             for name in ("trainer", "server")]
    ids = managed.record_pipeline(store, "grp", tasks, parallel=True, primary_tasks=["trainer"])
    controller = Controller(client, store, "test", ControllerSettings(grace_seconds=0))
    asyncio.run(controller.tick())
    first = {job: store.attempts_of([job])[job][-1] for job in ids}
    assert {a.cluster for a in first.values()} == {"alpine"}
    for job in ids:
        client.infras["alpine"].finish(first[job].handle, JobState.RUNNING)
    asyncio.run(controller.tick())
    client.infras["alpine"].unreachable = True
    asyncio.run(controller.tick())  # seen unreachable (the grace starts)
    asyncio.run(controller.tick())  # beyond it: both recovered, on the one other cluster with H100s
    moved = {job: store.attempts_of([job])[job] for job in ids}
    assert [[(a.number, a.cluster, a.state) for a in moved[job]] for job in ids] == [
        [(1, "alpine", "CANCELLING"), (2, "borealis", "PENDING")]] * 2
    # a new round: their host files go to a folder of their own, not the lost cluster's (homes may be shared)
    before, after = ({r.extra_env["CORRAL_JOBGROUP_ROUND"] for r in client.infras[c].requests}
                     for c in ("alpine", "borealis"))
    assert len(before) == len(after) == 1 and before != after
    assert {m.group_round for m in store.managed(ids)} == after
    assert [v.managed.state for v in managed.views(store, ids)] == ["RECOVERING", "RECOVERING"]
    client.infras["alpine"].unreachable = False
    asyncio.run(controller.tick())
    assert {first[job].handle for job in ids} <= set(client.infras["alpine"].cancelled)


def test_a_job_group_no_cluster_can_run_whole_waits_and_says_why(store):
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes()
    tasks = [(parse_task({"name": name, "resources": {"accelerators": gpus}, "run": "true"}, "t"), "t")
             for name, gpus in (("a", "B300:1"), ("b", "L40S:1"))]  # only cirrus has B300, only borealis L40S
    ids = managed.record_pipeline(store, "grp", tasks, parallel=True)
    assert asyncio.run(Controller(client, store, "test", ControllerSettings()).tick()).submitted == 0
    for view in managed.views(store, ids):
        assert view.managed.state == "PENDING" and not view.attempts
        assert view.managed.reason.startswith("no cluster can run every task of its job group now: a: ")


class Checkpointing(FakeInfra, CopiesCheckpoints):
    """Copies a checkpoint out (`fetches` counts it); records what each submission had sent with it (its
    token), and whether its local copy was still there when the submission read it."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.sent: list[tuple[str, str | None, bool]] = []  # (remote, token, its local copy there at submit)
        self.pending: list[tuple[Path, str, str | None]] = []
        self.fetches = 0

    async def fetch_dir(self, remote_dir, local_dir):
        self.fetches += 1
        local_dir.mkdir(parents=True, exist_ok=True)
        (local_dir / "step.txt").write_text(f"from {self.cluster}\n")
        return True

    async def upload(self, local, remote, token=None):
        await super().upload(local, remote, token)
        self.pending.append((Path(local), remote, token))

    async def submit(self, request):
        self.sent += [(remote, token, (local / "step.txt").exists()) for local, remote, token in self.pending
                      if token == request.token]
        self.pending.clear()
        return await super().submit(request)


def test_a_recovered_jobs_checkpoint_goes_with_its_new_attempt_and_is_there_when_it_is_submitted(store):
    """The checkpoint fetched from the cluster the job ran on goes to the one it lands on, as part of that
    submission (its token), and its local copy is still there when the submission reads it: a backend
    that ships files with the submission (Kubernetes' ConfigMap) packs them then, not at upload time."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    client = fakes(Checkpointing)
    [job_id] = managed.record(store, parse_task({"resources": {"accelerators": "H100:1"}, "run": "true"}, "t"), "t")
    controller = Controller(client, store, "test", ControllerSettings(unhealthy_after_failures=1))
    asyncio.run(controller.tick())
    [first] = store.attempts_of([job_id])[job_id]
    assert first.cluster == "alpine" and client.infras["alpine"].sent == []
    client.infras["alpine"].finish(first.handle, JobState.FAILED, FailureClass.INFRA, native="NODE_FAIL")
    asyncio.run(controller.tick())  # alpine avoided after its failure: recovered on borealis, checkpoint along
    second = store.attempts_of([job_id])[job_id][-1]
    [request] = client.infras["borealis"].requests
    assert second.cluster == "borealis" and second.token == request.token
    assert client.infras["borealis"].sent == [(f".corral/checkpoints/{job_id}/", request.token, True)]
    story = [e.reason for e in store.events(job_id)]
    assert "checkpoint copied from alpine to borealis" in story
    assert story.index("checkpoint copied from alpine to borealis") < len(story) - 1  # before "attempt 2 submitted"



def test_a_checkpoint_goes_where_the_submission_lands_when_its_first_choice_refuses(store):
    """Recovered away from alpine, the job's first choice (borealis) refuses it and cirrus takes it: the
    checkpoint, fetched once, goes with cirrus' submission, and the job's story names cirrus."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings
    from tests.test_placement import SNAPSHOTS

    client = fakes(Checkpointing)
    [job_id] = managed.record(store, parse_task({"resources": {"cpus": 1}, "run": "true"}, "t"), "t")
    controller = Controller(client, store, "test", ControllerSettings(unhealthy_after_failures=1))
    asyncio.run(controller.tick())
    [first] = store.attempts_of([job_id])[job_id]
    assert first.cluster == "alpine"
    client.infras["borealis"].refuse = {p.name for p in SNAPSHOTS["borealis"].partitions}
    client.infras["alpine"].finish(first.handle, JobState.FAILED, FailureClass.INFRA, native="NODE_FAIL")
    asyncio.run(controller.tick())
    attempts = store.attempts_of([job_id])[job_id]
    refused = client.infras["borealis"].requests
    assert [(a.cluster, a.state) for a in attempts[1:]] == [("borealis", "SUBMIT_FAILED")] * len(refused) + [
        ("cirrus", "PENDING")]
    [taken] = client.infras["cirrus"].requests
    assert client.infras["borealis"].sent == [(f".corral/checkpoints/{job_id}/", r.token, True) for r in refused]
    assert client.infras["cirrus"].sent == [(f".corral/checkpoints/{job_id}/", taken.token, True)]
    assert client.infras["alpine"].fetches == 1
    story = [e.reason for e in store.events(job_id)]
    assert "checkpoint copied from alpine to cirrus" in story and not any("to borealis" in r for r in story)


class Streaming(Checkpointing, TakesFolderStreams):
    """Sends a checkpoint straight to another streaming fake (send_dir): nothing fetched to this machine.
    `source_fails` / `target_fails`: its side of a stream breaks (ssh's error, naming this cluster)."""

    def __init__(self, *args, source_fails: bool = False, target_fails: bool = False, **kw):
        super().__init__(*args, **kw)
        self.source_fails, self.target_fails = source_fails, target_fails
        self.streamed: list[str] = []  # destinations of streams it received

    def stream_target(self):
        return self, self.cluster

    async def send_dir(self, remote_dir, target, destination):
        from corral.errors import ClusterUnreachableError

        if self.source_fails:
            raise ClusterUnreachableError(self.cluster, "connection to the login node timed out")
        if target.target_fails:
            raise ClusterUnreachableError(target.cluster, "lost the connection to the login node")
        target.streamed.append(destination)
        return True


def recovered(client, store) -> tuple[str, list[str]]:
    """A managed job that ran on alpine, recovered elsewhere after a node failure: its id and story."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings

    [job_id] = managed.record(store, parse_task({"resources": {"cpus": 1}, "run": "true"}, "t"), "t")
    controller = Controller(client, store, "test", ControllerSettings(unhealthy_after_failures=1))
    asyncio.run(controller.tick())
    [first] = store.attempts_of([job_id])[job_id]
    assert first.cluster == "alpine"
    client.infras["alpine"].finish(first.handle, JobState.FAILED, FailureClass.INFRA, native="NODE_FAIL")
    asyncio.run(controller.tick())
    return job_id, [e.reason for e in store.events(job_id)]


def test_a_checkpoint_goes_straight_from_login_node_to_login_node_where_both_take_streams(store):
    client = fakes(Streaming)
    job_id, story = recovered(client, store)
    landed = store.attempts_of([job_id])[job_id][-1].cluster
    assert client.infras[landed].streamed == [f".corral/checkpoints/{job_id}/"]
    assert client.infras["alpine"].fetches == 0 and client.infras[landed].sent == []  # nothing through here
    assert f"checkpoint copied from alpine to {landed}" in story


def test_a_stream_whose_source_fails_leaves_the_job_to_start_without_it_and_says_why(store):
    client = fakes(Streaming, alpine={"source_fails": True})
    job_id, story = recovered(client, store)
    assert store.attempts_of([job_id])[job_id][-1].state == JobState.PENDING  # submitted all the same
    assert "checkpoint not copied from alpine: alpine: connection to the login node timed out" in story


def test_a_stream_whose_target_fails_fails_the_submission_over_to_the_next_place(store):
    client = fakes(Streaming, borealis={"target_fails": True})
    job_id, story = recovered(client, store)
    attempts = store.attempts_of([job_id])[job_id]
    assert attempts[-1].cluster == "cirrus" and client.infras["cirrus"].streamed
    assert any(a.cluster == "borealis" and a.state == JobState.SUBMIT_FAILED for a in attempts)
    assert "checkpoint copied from alpine to cirrus" in story
