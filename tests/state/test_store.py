"""The state store on SQLite and on a real PostgreSQL server, through the same SQLAlchemy layer."""

from __future__ import annotations

import time

import pytest

from corral.errors import ConfigError, UnavailableError
from corral.infra.base import JobState
from corral.state import Store
from corral.state.models import AttemptRow, Base, JobRow
from corral.state.store import JobFilter, JobNotFoundError


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path) -> Store:
    if request.param == "sqlite":
        return Store(f"sqlite:///{tmp_path / 'state.db'}")
    url = request.getfixturevalue("postgres_url")
    store = Store(url)
    with store.engine.begin() as conn:  # each test starts empty
        tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
        conn.exec_driver_sql(f"TRUNCATE {tables} CASCADE")
    return store


def job(job_id: str, name: str = "train", rank: int = 0) -> JobRow:
    return JobRow(id=job_id, name=name, task_json="{}", created_at=time.time() + rank, job_rank=rank, num_jobs=1)


def attempt(token: str, job_id: str, number: int = 1, state: str = "SUBMITTING") -> AttemptRow:
    return AttemptRow(token=token, job_id=job_id, number=number, cluster="alpine", partition="gpu", state=state,
                      created_at=time.time(), run_dir=f".corral/runs/{token}", log_path=f".corral/runs/{token}/log.txt")


def test_jobs_attempts_and_the_latest_attempt(store):
    store.add_jobs([job("c-1"), job("c-2", "eval", rank=1)], [attempt("t1", "c-1"), attempt("t2", "c-2")])
    store.add_jobs([], [attempt("t3", "c-1", number=2)])
    store.update_attempt("t1", state="SUBMIT_FAILED")
    store.update_attempts({"t3": {"state": "RUNNING", "handle": "42"}, "t2": {"state": "SUCCEEDED"}})
    views = {v.job.id: v for v in store.views()}
    assert (views["c-1"].attempt.token, views["c-1"].attempt.state, views["c-1"].attempt.handle) == (
        "t3", "RUNNING", "42")
    assert {a.token for a in store.active_attempts()} == {"t3"}


def test_resolve_by_id_prefix_or_name(store):
    store.add_jobs([job("c-abc1"), job("c-abd2", "eval", rank=1)], [attempt("t1", "c-abc1"), attempt("t2", "c-abd2")])
    assert store.resolve("c-abc1").job.id == "c-abc1"
    assert store.resolve("c-abd").job.id == "c-abd2"
    assert store.resolve("eval").job.id == "c-abd2"
    with pytest.raises(JobNotFoundError, match="matches several jobs"):
        store.resolve("c-ab")
    with pytest.raises(JobNotFoundError, match="no job 'zzz'; see `corral queue`"):
        store.resolve("zzz")


def test_a_second_store_on_the_same_url_sees_committed_writes(store):
    store.add_jobs([job("c-1")], [attempt("t1", "c-1")])
    other = Store(store.url)
    assert [v.job.id for v in other.views()] == ["c-1"]


def test_managed_changes_in_one_transaction_keep_their_order_and_events(store):
    from corral.state.models import JobRow

    columns = [c.key for c in JobRow.__table__.columns]
    store.add_managed_jobs([{key: getattr(row, key) for key in columns}
                            for row in (job(f"c-{i}", rank=i) for i in range(3))])
    store.add_jobs([], [attempt(f"t{i}", f"c-{i}") for i in range(3)])
    store.set_managed_many([
        ("c-0", "RUNNING", "on slurm/alpine/gpu", {}),
        ("c-0", None, "checkpoint copied", {"moves": 1}),
        ("c-0", "RUNNING", "on slurm/alpine/gpu", {"recoveries": 2}),  # same state and reason: no event
        ("c-1", "RECOVERING", "NODE_FAIL", {"recoveries": 1}),
    ])
    assert [(e.state, e.reason) for e in store.events("c-0")] == [
        ("PENDING", "submitted"), ("RUNNING", "on slurm/alpine/gpu"), ("RUNNING", "checkpoint copied")]
    rows = {m.job_id: m for m in store.managed()}
    assert (rows["c-0"].state, rows["c-0"].moves, rows["c-0"].recoveries) == ("RUNNING", 1, 2)
    assert (rows["c-1"].state, rows["c-1"].reason, rows["c-1"].recoveries) == ("RECOVERING", "NODE_FAIL", 1)
    assert (rows["c-2"].state, rows["c-2"].reason) == ("PENDING", None)
    with pytest.raises(JobNotFoundError):
        store.set_managed_many([("c-2", "RUNNING", "x", {}), ("c-9", "RUNNING", "x", {})])
    assert store.managed(["c-2"])[0].state == "PENDING"  # all or nothing


def test_a_job_groups_tasks_read_back_in_order_with_their_names_and_which_are_auxiliary(store):
    """pipeline_members is one query for a task's page; the plain copies a tick reads answer the
    row's own properties (auxiliary, group_id) as the ORM rows do."""
    columns = [c.key for c in JobRow.__table__.columns]
    store.add_managed_jobs([{key: getattr(row, key) for key in columns}
                            for row in (job("c-0", "server"), job("c-1", "trainer", rank=1))],
                           pipeline_name="grp", parallel=True, delays=[30.0, None])
    store.add_managed_jobs([{key: getattr(job("c-2"), key) for key in columns}])
    assert store.pipeline_members("c-0") == [("c-0", "server", True), ("c-1", "trainer", False)]
    tasks = store.pipeline_tasks(["c-0"])["c-0"]
    assert [(t.job_id, t.auxiliary, t.group_id) for t in tasks] == [("c-0", True, "c-0"), ("c-1", False, "c-0")]
    [alone] = store.managed(["c-2"])
    assert (alone.auxiliary, alone.group_id) == (False, None)


def test_ended_run_dirs_are_those_whose_every_attempt_ended_long_enough_ago(store):
    """run_files.py's query: an array's copies share a run directory (it waits for the last one), a
    live dev allocation's is left out, an attempt with no run directory (never submitted) too, and a
    directory once marked is not found again. Each comes with one of its attempts' handles (a pool's
    names its machines)."""
    from corral.state.models import AllocationRow, RunDirState

    def found(*args, **kwargs) -> dict:
        return {key: sorted((e.run_dir, e.handle) for e in ended)
                for key, ended in store.ended_run_dirs(*args, **kwargs).items()}

    def ended(token, job_id, run_dir, at, state="SUCCEEDED", cluster="alpine"):
        row = attempt(token, job_id, state=state)
        row.run_dir, row.ended_at, row.cluster, row.handle = run_dir, at, cluster, f"h-{token}"
        return row

    store.add_jobs([job("c-1"), job("c-2", rank=1), job("c-3", rank=2), job("c-4", rank=3), job("c-5", rank=4),
                    job("c-6", rank=5)], [
        ended("a1", "c-1", "r/done", 100.0),
        ended("a2.0", "c-2", "r/array", 100.0), ended("a2.1", "c-3", "r/array", None, state="RUNNING"),
        ended("a4", "c-4", "", 100.0, state="SUBMIT_FAILED"),
        ended("a5", "c-5", "r/alloc", 100.0, state="FAILED"),
        ended("a6", "c-6", "r/recent", 900.0, cluster="borealis")])
    store.put_allocation(AllocationRow(name="dev", token="t", cluster="alpine", partition="gpu", num_nodes=1,
                                       resources="{}", run_dir="r/alloc", created_at=1.0))
    assert found(500.0, 100, clusters=["alpine", "borealis"]) == {("alpine", ""): [("r/done", "h-a1")]}
    assert found(1000.0, 100, clusters=["alpine"]) == {("alpine", ""): [("r/done", "h-a1")]}
    assert found(1000.0, 100, clusters=["borealis"]) == {("borealis", ""): [("r/recent", "h-a6")]}
    store.update_attempt("a2.1", state="SUCCEEDED", ended_at=200.0)
    store.mark_run_dirs("alpine", ["r/done"], RunDirState.ENV_REMOVED)
    assert found(500.0, 100, clusters=["alpine"]) == {("alpine", ""): [("r/array", "h-a2.1")]}
    assert found(500.0, 1, clusters=["alpine", "borealis"]) == {("alpine", ""): [("r/array", "h-a2.1")]}
    assert found(1000.0, 100, clusters=["alpine", "borealis"], skip=[("alpine", "")]) == {
        ("borealis", ""): [("r/recent", "h-a6")]}  # a user the pass could not act as on a cluster
    assert store.views(["c-1"])[0].attempt.run_dir_state == "env-removed"
    # the whole directory: those whose env.sh went, and those Corral removed nothing of, until removed
    assert found(500.0, 100, clusters=["alpine"], removing=RunDirState.REMOVED) == {
        ("alpine", ""): [("r/array", "h-a2.1"), ("r/done", "h-a1")]}
    store.mark_run_dirs("alpine", ["r/done"], RunDirState.REMOVED)
    assert found(500.0, 100, clusters=["alpine"], removing=RunDirState.REMOVED) == {
        ("alpine", ""): [("r/array", "h-a2.1")]}


def test_ended_groups_are_those_whose_every_task_ended_long_enough_ago_with_where_they_ran(store):
    """run_files.py's query for job groups' host folders: every task in a terminal state and every
    attempt ended before the bound; each with the clusters (and owners) its attempts ran on; none once
    marked; a pipeline that is not a group, never."""
    columns = [c.key for c in JobRow.__table__.columns]

    def group(*ids: str, parallel: bool = True) -> None:
        store.add_managed_jobs([{key: getattr(job(i, rank=n), key) for key in columns} for n, i in enumerate(ids)],
                               pipeline_name="g", parallel=parallel, delays=[None] * len(ids) if parallel else None)

    def ran(token: str, job_id: str, cluster: str, ended_at: float | None) -> AttemptRow:
        row = attempt(token, job_id, state="SUCCEEDED" if ended_at else "RUNNING")
        row.cluster, row.ended_at = cluster, ended_at
        return row

    group("c-a0", "c-a1")
    group("c-b0", "c-b1")
    group("c-p0", "c-p1", parallel=False)
    store.add_jobs([], [ran("t1", "c-a0", "alpine", 100.0), ran("t2", "c-a1", "alpine", 90.0),
                        ran("t3", "c-a1", "borealis", 120.0), ran("t4", "c-b0", "alpine", None),
                        ran("t5", "c-p0", "alpine", 100.0), ran("t6", "c-p1", "alpine", 100.0)])
    for job_id in ("c-a0", "c-a1", "c-p0", "c-p1"):
        store.set_managed(job_id, "SUCCEEDED")
    store.set_managed("c-b0", "FAILED")  # its attempt still unsettled, its partner still running
    assert store.ended_groups(500.0, 100) == {"c-a0": {("alpine", ""), ("borealis", "")}}
    assert store.ended_groups(500.0, 1) == {"c-a0": {("alpine", ""), ("borealis", "")}}  # not hidden by c-b0
    assert store.ended_groups(110.0, 100) == {}  # its last attempt ended at 120
    store.set_managed("c-b1", "CANCELLED")
    store.update_attempt("t4", state="FAILED", ended_at=50.0)
    assert store.ended_groups(500.0, 100) == {"c-a0": {("alpine", ""), ("borealis", "")}, "c-b0": {("alpine", "")}}
    assert len(store.ended_groups(500.0, 1)) == 1
    store.mark_groups_cleaned(["c-a0"])
    assert store.ended_groups(500.0, 100) == {"c-b0": {("alpine", "")}}


def test_attempt_updates_for_unknown_tokens_are_ignored(store):
    store.add_jobs([job("c-1")], [attempt("t1", "c-1")])
    store.update_attempts({"t1": {"state": "RUNNING"}, "gone": {"state": "RUNNING"}})
    assert store.views()[0].attempt.state == "RUNNING"


def test_new_job_ids_are_unique_even_when_random_ids_collide(store, monkeypatch):
    import corral.state.store as store_module

    store.add_jobs([job("c-000000000001")], [])
    pool = iter(["c-000000000001", "c-000000000002", "c-000000000002", "c-000000000003"] * 10)
    monkeypatch.setattr(store_module, "new_job_id", lambda: next(pool))
    assert store.new_job_ids(2) == ["c-000000000002", "c-000000000003"]


def test_job_ids_carry_48_random_bits():
    from corral.state.store import new_job_id

    ids = {new_job_id() for _ in range(100_000)}
    assert len(ids) == 100_000 and all(len(i) == 14 and i.startswith("c-") for i in ids)


def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path):
    """Two commands that first open a new store at the same moment: neither fails on CREATE TABLE."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'state.db'}"
    start_at = time.time() + 1.5
    script = (
        "import sys, time\n"
        "from corral.state import Store\n"
        "from corral.state.models import JobRow\n"
        f"time.sleep(max(0, {start_at} - time.time()))\n"
        f"s = Store({url!r})\n"
        "s.add_jobs([JobRow(id='c-' + sys.argv[1], name='x', task_json='{}', created_at=0.0)], [])\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, f"{i:012d}"], stderr=subprocess.PIPE, text=True)
             for i in range(6)]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors
    assert len(Store(url).views()) == 0 and len(Store(url).jobs([f"c-{i:012d}" for i in range(6)])) == 6


def ended(job_id: str, at: float, state: str = "SUCCEEDED", sweep: str | None = None, rank: int = 0):
    row = JobRow(id=job_id, name="train", task_json="{}", created_at=at, job_rank=rank, num_jobs=1, sweep_id=sweep)
    return row, AttemptRow(token=f"t-{job_id}", job_id=job_id, number=1, cluster="alpine", partition="gpu",
                           state=state, created_at=at, run_dir="r", log_path="l")


def fill(store: Store, rows) -> None:
    store.add_jobs([j for j, _ in rows], [a for _, a in rows])


def test_queue_page_shows_live_jobs_and_the_newest_ended_ones(store):
    fill(store, [ended(f"c-{i:04d}", 1000.0 + i) for i in range(250)])
    fill(store, [ended("c-live", 10.0, "RUNNING"), ended("c-pend", 11.0, "PENDING")])
    page = store.queue_page(limit=20)
    ids = [v.job.id for v in page.views]
    assert ids[:20] == [f"c-{i:04d}" for i in range(249, 229, -1)]  # newest first
    assert ids[20:] == ["c-pend", "c-live"] and page.more == 230  # live ones always, however old
    second = store.queue_page(limit=20, offset=20, live=False)
    assert [v.job.id for v in second.views][0] == "c-0229" and second.more == 210
    recent = store.queue_page(limit=100, since=1000.0 + 240)
    assert len(recent.views) == 10 + 2 and recent.more == 0
    everything = [v.job.id for v in store.iter_queue()]
    assert everything == [f"c-{i:04d}" for i in range(249, -1, -1)] + ["c-pend", "c-live"]


def test_live_job_ids_are_the_jobs_that_may_still_run_whoever_owns_the_rest(store):
    rows = [ended(f"c-{i:03d}", 1000.0 + i) for i in range(50)]
    rows += [ended("c-run", 10.0, "RUNNING"), ended("c-sub", 11.0, "SUBMITTING"), ended("c-off", 12.0, "CANCELLING"),
             ended("c-bob", 13.0, "PENDING")]
    rows[-1][0].owner = "bob"
    fill(store, rows)
    store.add_jobs([], [attempt("t-again", "c-000", number=2, state="PENDING")])  # a later attempt that may run
    assert sorted(store.live_job_ids()) == ["c-000", "c-bob", "c-off", "c-run", "c-sub"]
    assert sorted(store.live_job_ids("")) == ["c-000", "c-off", "c-run", "c-sub"]
    assert store.live_job_ids("bob") == ["c-bob"] and store.live_job_ids("carol") == []


def test_an_attempt_cancelled_meanwhile_ends_cancelled_keeping_its_exit_code(store):
    ids = ["c-run", "c-off", "c-req", "c-undo"]
    fill(store, [ended(job_id, 10.0 + i, "RUNNING") for i, job_id in enumerate(ids)])
    run, off, req, undo = [v.attempt.token for v in store.views(ids)]
    store.update_attempt(off, state="CANCELLED", reason="cancelled by user", ended_at=12.0)
    store.update_attempts({t: {"state": "CANCELLING", "reason": "cancelled by user"} for t in (req, undo)})
    store.undo_cancelling([undo, run, off], JobState.RUNNING)  # the cancel could not be sent: only `undo` was
    for token in (run, off, req):
        store.end_attempt(token, state="FAILED", exit_code=137, reason="interrupted", ended_at=20.0)
    got = {v.job.id: (v.attempt.state, v.attempt.exit_code, v.attempt.reason, v.attempt.ended_at)
           for v in store.views(ids)}
    assert got == {"c-run": ("FAILED", 137, "interrupted", 20.0), "c-off": ("CANCELLED", 137, "cancelled by user", 12.0),
                   "c-req": ("CANCELLED", 137, "cancelled by user", 20.0), "c-undo": ("RUNNING", None, None, None)}


def test_a_job_page_filters_by_user_state_cluster_and_name_on_the_latest_attempt(store):
    rows = [ended(f"c-{i:04d}", 1000.0 + i, "SUCCEEDED" if i % 3 else "FAILED") for i in range(120)]
    for i, (row, _) in enumerate(rows):
        row.owner, row.name = ("alice" if i % 2 else "bob"), f"train_{i}%"
    fill(store, rows)
    # c-0000 failed on alpine, then its second attempt runs on borealis: filters see the second.
    store.add_jobs([], [AttemptRow(token="t-c-0000-2", job_id="c-0000", number=2, cluster="borealis",
                                   partition="h100", state="RUNNING", created_at=2000.0, run_dir="r", log_path="l")])

    def ids(wanted: JobFilter, **kwargs) -> tuple[list[str], int]:
        shown, total = store.job_page(wanted, **kwargs)
        return [v.job.id for v in shown], total

    assert ids(JobFilter(), limit=5) == ([f"c-{i:04d}" for i in range(119, 114, -1)], 120)  # newest first
    assert ids(JobFilter(), limit=50, offset=100)[0][-1] == "c-0000"
    assert ids(JobFilter(state="RUNNING")) == (["c-0000"], 1)
    assert ids(JobFilter(state="live")) == (["c-0000"], 1)
    assert ids(JobFilter(cluster="borealis")) == (["c-0000"], 1)
    assert ids(JobFilter(state="FAILED"), limit=100)[1] == 39  # 40 failed first attempts, less c-0000's
    assert ids(JobFilter(owner="alice"), limit=100)[1] == 60
    assert ids(JobFilter(owner="alice", state="FAILED"), limit=100)[1] == 20
    assert ids(JobFilter(name="TRAIN_11")) == ([f"c-{i:04d}" for i in (119, 118, 117, 116, 115, 114, 113, 112,
                                                                       111, 110, 11)], 11)
    assert ids(JobFilter(name="_7%")) == (["c-0007"], 1)  # % and _ are the name's, not wildcards
    assert ids(JobFilter(name="%"), limit=1)[1] == 120
    assert ids(JobFilter(), scope="bob", limit=100)[1] == 60
    assert ids(JobFilter(owner="alice"), scope="bob") == ([], 0)  # a user's scope wins over a filter
    assert ids(JobFilter(state="RUNNING,FAILED"), limit=100)[1] == 40  # several states (squeue -t R,F)
    assert ids(JobFilter(state="live,SUCCEEDED"), limit=100)[1] == 81
    assert ids(JobFilter(since=1115.0)) == ([f"c-{i:04d}" for i in range(119, 114, -1)], 5)
    store.add_jobs([JobRow(id="c-exec", name="exec", task_json="{}", created_at=3000.0, allocation="dev")],
                   [attempt("t-exec", "c-exec", state="RUNNING")])
    assert ids(JobFilter(allocation="dev")) == (["c-exec"], 1)


def test_a_dense_filter_walks_by_creation_and_gives_the_same_pages_as_a_sort(store, monkeypatch):
    """A state or cluster matching most of the history pages by a walk in creation order that stops
    once the page is full (`-t CD` over 100,000 completed jobs used to sort them all): the same pages,
    in the same order, as sorting every match, whatever the filters, offsets and ties in creation time."""
    rows = [ended(f"c-{i:04d}", 1000.0 + i // 3, "SUCCEEDED" if i % 4 else "FAILED", rank=i % 3) for i in range(300)]
    for i, (row, _) in enumerate(rows):
        row.owner, row.name = ("alice" if i % 2 else "bob"), f"train_{i}"
    fill(store, rows)
    store.add_jobs([], [AttemptRow(token="t-c-0004-2", job_id="c-0004", number=2, cluster="borealis",
                                   partition="h100", state="SUCCEEDED", created_at=2000.0, run_dir="r", log_path="l")])
    filters = [JobFilter(state="SUCCEEDED"), JobFilter(state="FAILED,SUCCEEDED", owner="alice"),
               JobFilter(cluster="alpine"), JobFilter(state="SUCCEEDED", name="train_1", since=1010.0),
               JobFilter(state="FAILED")]
    pages = [dict(limit=limit, offset=offset) for limit, offset in ((20, 0), (7, 13), (50, 200), (20, 400))]

    def ids(wanted: JobFilter, **kwargs) -> tuple[list[str], int]:
        shown, total = store.job_page(wanted, **kwargs)
        return [v.job.id for v in shown], total

    sorted_pages = [ids(f, **page) for f in filters for page in pages]
    monkeypatch.setattr("corral.state.store.DENSE_MATCHES", 0)
    monkeypatch.setattr("corral.state.store.DENSE_CHUNK", 16)  # many steps, some ending inside a tie
    walked = [ids(f, **page) for f in filters for page in pages]
    assert walked == sorted_pages
    assert sorted_pages[0] == ([f"c-{i:04d}" for i in (299, 298, 297, 295, 294, 293, 291, 290, 289, 287, 286, 285,
                                                       283, 282, 281, 279, 278, 277, 275, 274)], 226)


def test_a_sweep_is_counted_whole_by_state_and_spans_its_first_start_to_its_last_end(store):
    rows = [ended(f"c-s{i:03d}", 500.0, "SUCCEEDED" if i < 7 else "FAILED", sweep="c-s000", rank=i) for i in range(10)]
    for i, (_, attempt) in enumerate(rows):
        attempt.submitted_at, attempt.started_at, attempt.ended_at = 505.0 + i, 510.0 + i, 520.0 + i
    fill(store, rows)
    page = store.queue_page(limit=3)
    assert page.sweep_times == {"c-s000": (510.0, 529.0, 505.0)}  # of all its jobs, not only the page's
    store.add_jobs([], [AttemptRow(token="t-c-s009-2", job_id="c-s009", number=2, cluster="borealis",
                                   partition="h100", state="RUNNING", created_at=600.0, run_dir="r", log_path="l",
                                   started_at=605.0)])
    page = store.queue_page(limit=3)
    assert page.sweeps == {"c-s000": {"SUCCEEDED": 7, "FAILED": 2, "RUNNING": 1}}  # latest attempt of each job
    assert page.sweep_times == {"c-s000": (510.0, None, 505.0)}  # not ended while a job is live


def test_resolve_finds_by_id_prefix_and_name_without_reading_history(store):
    fill(store, [ended("c-abc1", 1.0), ended("c-abd2", 2.0), ended("c-x_%", 3.0)])
    lone, attempt = ended("c-named", 4.0)
    lone.name = "the-one"
    fill(store, [(lone, attempt)])
    assert store.resolve("c-abc1").job.id == "c-abc1" and store.resolve("c-abd").job.id == "c-abd2"
    assert store.resolve("c-x_").job.id == "c-x_%"  # LIKE wildcards in a reference are literal
    with pytest.raises(JobNotFoundError, match="matches several jobs"):
        store.resolve("c-ab")
    with pytest.raises(JobNotFoundError, match="no job 'c-a_c'"):
        store.resolve("c-a_c")
    assert store.resolve("the-one").job.id == "c-named"
    with pytest.raises(JobNotFoundError, match="matches several jobs"):
        store.resolve("train")


def test_a_slurm_job_id_finds_its_job_and_an_array_id_all_its_tasks(store):
    def at(job_id, cluster, handle, sweep=None, rank=0):
        row, attempt = ended(job_id, 10.0 + rank, sweep=sweep, rank=rank)
        attempt.cluster, attempt.handle = cluster, handle
        return row, attempt

    fill(store, [at("c-one", "alpine", "39"), at("c-two", "borealis", "39"), at("c-three", "alpine", "41")])
    fill(store, [at(f"c-t{i}", "alpine", f"40_{i}", sweep="c-t0", rank=i) for i in range(12)])
    assert store.resolve("41").job.id == "c-three" and store.resolve("40_11").job.id == "c-t11"
    with pytest.raises(JobNotFoundError, match=r"Slurm job 39 is several jobs of Corral's \(c-\w+ on \w+, c-"):
        store.resolve("39")
    assert sorted(v.job.id for v in store.resolve_all("40")) == sorted(f"c-t{i}" for i in range(12))
    with pytest.raises(JobNotFoundError, match=r"Slurm job 40 is an array of 12 tasks: give one of them \(40_…"):
        store.resolve("40")  # `corral logs 40`: one job is wanted
    assert [v.job.id for v in store.resolve_all("40_1")] == ["c-t1"]  # not 40_10 and 40_11 as well
    with pytest.raises(JobNotFoundError, match="no job '4'"):
        store.resolve_all("4")
    with pytest.raises(JobNotFoundError, match="no job '40'"):  # another user's array is not found
        store.resolve_all("40", scope="someone-else")
    assert (store.clusters_of_native_job("39"), store.clusters_of_native_job("41")) == (["alpine", "borealis"], ["alpine"])
    assert store.clusters_of_native_job("40") == ["alpine"]  # an array's id: where its tasks are
    assert store.clusters_of_native_job("4") == [] and store.clusters_of_native_job("4_%") == []
    assert store.clusters_of_native_job("41", scope="someone-else") == []
    fill(store, [at("c-far", "borealis", "40_0", sweep="c-far")])
    with pytest.raises(JobNotFoundError, match=r"array 40 is on several clusters \(alpine, borealis\)"):
        store.resolve_all("40")
    assert store.clusters_of_native_job("40") == ["alpine", "borealis"]


def test_a_dev_allocations_name_means_its_newest_job_where_one_job_is_shown(store):
    """`corral logs dev`, as `sky logs CLUSTER`: the allocation's latest job; cancel is not widened."""
    rows = [ended(f"c-e{i}", 10.0 + i) for i in range(3)]
    for row, _ in rows:
        row.allocation = "dev"
    fill(store, rows)
    assert store.resolve_or_newest_in("dev").job.id == "c-e2"
    assert store.resolve_or_newest_in("c-e0").job.id == "c-e0"
    with pytest.raises(JobNotFoundError, match="no job 'dev'"):
        store.resolve_all("dev")
    with pytest.raises(JobNotFoundError, match="no job 'dev'"):
        store.resolve_or_newest_in("dev", scope="someone-else")


def test_a_dev_allocations_jobs_are_numbered_from_its_making_oldest_first(store):
    """`sky queue CLUSTER`'s 1, 2, …: the jobs run in the allocation since it was made (an older
    allocation of that name had its own), in the order they were made; another user's are not in it."""
    rows = [ended(f"c-a{i}", created) for i, created in enumerate([5.0, 12.0, 11.0, 20.0])]
    for (row, _), owner in zip(rows, ["", "", "", "bob"]):
        row.allocation, row.owner = "dev", owner
    fill(store, rows)
    assert store.allocation_job_ids("dev", "", since=10.0) == ["c-a2", "c-a1"]
    assert store.allocation_job_ids("dev", "", since=0.0) == ["c-a0", "c-a2", "c-a1"]
    assert store.allocation_job_ids("dev", "bob", since=10.0) == ["c-a3"]
    assert store.allocation_job_ids("other", "", since=0.0) == []


def test_managed_jobs_are_recorded_all_or_none(store):
    from sqlalchemy.exc import IntegrityError

    from corral.state.models import JobRow

    columns = [c.key for c in JobRow.__table__.columns]
    rows = [{key: getattr(row, key) for key in columns} for row in (job("c-1"), job("c-2"), job("c-1"))]
    with pytest.raises(IntegrityError):  # the third repeats the first's id
        store.add_managed_jobs(rows)
    assert store.views() == [] and store.managed() == [] and store.events("c-2") == []


def test_a_write_of_many_rows_goes_in_batches_and_a_sweeps_jobs_share_their_task(store):
    """A tick's write of thousands of changes is sent WRITE_BATCH rows at a time (the server's heap
    peaks at one batch's parameters), all in one transaction; a read of a sweep's jobs keeps one copy
    of their task's text."""
    from sqlalchemy import event

    from corral.state.store import WRITE_BATCH

    count = 2 * WRITE_BATCH + 1
    store.add_jobs([JobRow(id=f"c-{i}", name="sweep", task_json='{"run": "true"}', created_at=1.0, job_rank=i,
                           num_jobs=count) for i in range(count)],
                   [attempt(f"t{i}", f"c-{i}") for i in range(count)])
    batches: list[int] = []

    def executed(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE ATTEMPTS"):
            batches.append(len(parameters) if executemany else 1)

    event.listen(store.engine, "before_cursor_execute", executed)
    try:
        store.update_attempts({f"t{i}": {"state": "PENDING", "reason": "Priority"} for i in range(count)})
    finally:
        event.remove(store.engine, "before_cursor_execute", executed)
    assert batches == [WRITE_BATCH, WRITE_BATCH, 1]
    assert {a.state for a in store.active_attempts()} == {"PENDING"} and len(store.active_attempts()) == count
    jobs = store.jobs([f"c-{i}" for i in range(count)])
    assert len(jobs) == count and len({id(j.task_json) for j in jobs.values()}) == 1


def test_unanswered_attempts_are_settled_in_one_statement_per_outcome_and_never_over_an_answer(store):
    """A crashed sweep's hundreds of attempts sharing one outcome take one UPDATE, not one each; one
    whose submission was answered since the refresh read it keeps its answer."""
    from sqlalchemy import event

    count = 300
    store.add_jobs([job(f"c-{i}") for i in range(count)], [attempt(f"t{i}", f"c-{i}") for i in range(count)])
    store.accept_attempts({"t0": "77"}, time.time())  # answered while the refresh asked its cluster
    lost = {"state": JobState.SUBMIT_FAILED, "failure": "lost", "reason": "never reached Slurm", "ended_at": 5.0}
    settled = {f"t{i}": dict(lost) for i in range(count - 1)}
    settled[f"t{count - 1}"] = {"state": JobState.CANCELLED, "reason": "cancelled by user", "ended_at": 5.0}
    updates: list[str] = []

    def executed(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE ATTEMPTS"):
            updates.append(statement)

    event.listen(store.engine, "before_cursor_execute", executed)
    try:
        store.settle_unanswered(settled)
    finally:
        event.remove(store.engine, "before_cursor_execute", executed)
    assert len(updates) == 2  # one per distinct outcome
    attempts = {a.token: a for rows in store.attempts_of([f"c-{i}" for i in range(count)]).values() for a in rows}
    assert (attempts["t0"].state, attempts["t0"].handle) == ("PENDING", "77")
    assert {attempts[f"t{i}"].state for i in range(1, count - 1)} == {"SUBMIT_FAILED"}
    assert attempts[f"t{count - 1}"].state == "CANCELLED"


@pytest.mark.parametrize("url", ["garbage", "foo://x/y"])
def test_a_store_url_that_is_not_one_is_a_config_error(url):
    with pytest.raises(ConfigError, match=f"the store's URL \\(--db or CORRAL_DB_URL\\) '{url}' is not one SQLAlchemy"):
        Store(url)


def test_a_store_that_does_not_answer_is_unavailable_and_its_password_is_not_shown():
    with pytest.raises(UnavailableError, match=r"^the store postgresql://corral:\*\*\*@127\.0\.0\.1:1/x did not "
                                               "answer: .*Connection refused") as refused:
        Store("postgresql://corral:hunter2@127.0.0.1:1/x")
    assert "hunter2" not in str(refused.value)


def test_a_name_means_a_sweep_only_when_every_job_of_that_name_is_in_it(store):
    def job(job_id: str, name: str, sweep: str | None, owner: str = "") -> JobRow:
        return JobRow(id=job_id, name=name, task_json="{}", created_at=time.time(), num_jobs=2 if sweep else 1,
                      sweep_id=sweep, owner=owner)

    store.add_jobs([job("c-a0", "lr", "c-a0"), job("c-a1", "lr", "c-a0"), job("c-b0", "once", None),
                    job("c-c0", "both", "c-c0"), job("c-c1", "both", "c-c0"), job("c-d0", "both", None),
                    job("c-e0", "hers", "c-e0", owner="ann"), job("c-e1", "hers", "c-e0", owner="ann")], [])
    assert store.sweep_named("lr") == ["c-a0", "c-a1"]
    assert store.sweep_named("once") == [] and store.sweep_named("both") == [] and store.sweep_named("nope") == []
    assert store.sweep_named("hers", scope="bob") == [] and store.sweep_named("hers", scope="ann") == ["c-e0", "c-e1"]


def test_run_places_are_each_cluster_and_owner_that_ran_an_attempt_once(store):
    """The caches' prune visits these (run_files.prune_workdir_caches): an attempt never submitted
    (no run directory) names no place."""
    owned = job("c-2", rank=1)
    owned.owner = "bob"
    store.add_jobs([job("c-1"), owned, job("c-3", rank=2)],
                   [attempt("t1", "c-1"), attempt("t1b", "c-1", number=2), attempt("t2", "c-2"), attempt("t3", "c-3")])
    store.update_attempt("t3", run_dir="")
    store.update_attempt("t1b", cluster="borealis")
    assert store.run_places() == [("alpine", ""), ("alpine", "bob"), ("borealis", "")]
