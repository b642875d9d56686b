"""The state store on SQLite and on a real PostgreSQL server, through the same SQLAlchemy layer."""

from __future__ import annotations

import time

import pytest

from corral.state import Store
from corral.state.models import AttemptRow, Base, JobRow
from corral.state.store import JobNotFoundError


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
    store.update_attempts({"t3": {"state": "RUNNING", "slurm_job_id": "42"}, "t2": {"state": "SUCCEEDED"}})
    views = {v.job.id: v for v in store.views()}
    assert (views["c-1"].attempt.token, views["c-1"].attempt.state, views["c-1"].attempt.slurm_job_id) == (
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
    store.add_jobs([job(f"c-{i}", rank=i) for i in range(3)], [attempt(f"t{i}", f"c-{i}") for i in range(3)])
    store.add_managed(["c-0", "c-1", "c-2"])
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
