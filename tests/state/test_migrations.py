"""The store's schema through Alembic, on SQLite and a real PostgreSQL: a new store is created by the
migrations, an older one (made before Alembic, then widened column by column) is upgraded in place with
its data, and either way the result is exactly what the models describe."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from corral.state import Store, migrations
from corral.state.migrations.versions import v0001_baseline
from corral.state.models import Base

# What a store written before attempts had a failure class, a submitter or the held flag looked like.
LEGACY_LACKS = {"attempts": {"failure", "submitter", "held", "expected_start"}, "jobs": {"secrets_sealed"}}


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state.db'}"
        return
    url = request.getfixturevalue("fresh_postgres")
    yield url
    Store(url).engine.dispose()  # the next test's store finds the schema at head


def schema_differences(store: Store) -> list:
    with store.engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def test_the_head_the_store_checks_for_is_alembics():
    assert migrations.HEAD == migrations.head()


def test_a_new_store_is_made_at_head_and_matches_the_models(empty_url):
    store = Store(empty_url)
    with store.engine.connect() as conn:
        assert migrations.current(conn) == migrations.HEAD
    assert schema_differences(store) == []
    with store.engine.begin() as conn:  # Alembic reads the stamp: nothing left to run
        assert MigrationContext.configure(conn).get_current_heads() == (migrations.HEAD,)


def test_every_revision_from_an_empty_store_gives_the_models_schema(empty_url):
    """What an old store is upgraded through gives what a new store is made with."""
    from alembic import command

    engine = create_engine(empty_url)
    with engine.begin() as conn:
        command.upgrade(migrations._config(conn), "head")
        assert migrations.current(conn) == migrations.HEAD
    engine.dispose()
    assert schema_differences(Store(empty_url)) == []


def test_a_store_from_before_alembic_is_upgraded_with_its_data(empty_url):
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        v0001_baseline.metadata.create_all(conn)
        for table, columns in LEGACY_LACKS.items():
            for column in columns:
                conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute(text("INSERT INTO jobs (id, name, task_json, created_at, job_rank, num_jobs) "
                          "VALUES ('c-1', 'train', '{}', 1.0, 0, 1)"))
        conn.execute(text(
            "INSERT INTO attempts (token, job_id, number, cluster, partition, slurm_job_id, array_index, state, "
            "created_at, reason, run_dir, log_path) VALUES "
            "('t1', 'c-1', 1, 'alpine', 'gpu', '123_4', 4, 'FAILED', 1.0, 'NODE_FAIL', 'r', 'l'), "
            "('t2', 'c-1', 2, 'cirrus', 'debug', '77', NULL, 'RUNNING', 2.0, NULL, 'r2', 'l2')"))
        conn.execute(text(
            "INSERT INTO allocations (name, token, cluster, partition, slurm_job_id, num_nodes, gres, "
            "gpus_per_node, resources, run_dir, idle_seconds, created_at) VALUES "
            "('dev', 'tok', 'borealis', 'l40s', '55', 1, 'l40s', 1, '{}', 'rd', 0, 3.0)"))
    engine.dispose()

    store = Store(empty_url)
    with store.engine.connect() as conn:
        assert migrations.current(conn) == migrations.HEAD
    assert schema_differences(store) == []
    [view] = store.views(["c-1"])
    attempts = {a.token: a for a in store.attempts_of(["c-1"])["c-1"]}
    assert (attempts["t1"].handle, attempts["t1"].failure) == ("123_4", "infra")  # classified once, as before
    assert (attempts["t2"].handle, view.attempt.token) == ("77", "t2")
    allocation = store.allocation("dev")
    assert (allocation.handle, allocation.accelerator, allocation.owner) == ("55", "l40s", "")
    assert view.job.owner == ""  # made before users: the server's own account's
    Store(empty_url)  # opening it again changes nothing
    assert store.allocation("dev").handle == "55"


def test_a_store_at_the_baseline_revision_is_upgraded(empty_url):
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        v0001_baseline.metadata.create_all(conn)
        conn.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        conn.exec_driver_sql("INSERT INTO alembic_version VALUES ('0001')")
        conn.execute(text("INSERT INTO leases (name, holder, expires_at) VALUES ('controller', 'h:1', 9.0)"))
    engine.dispose()
    store = Store(empty_url)
    assert schema_differences(store) == []
    assert store.lease("controller").holder == "h:1"


def test_allocation_names_are_per_owner_after_the_upgrade(empty_url):
    from corral.state.models import AllocationRow

    store = Store(empty_url)
    fields = dict(name="dev", token="t", cluster="alpine", partition="gpu", handle="1", num_nodes=1,
                  accelerator=None, gpus_per_node=0, resources="{}", run_dir="r", idle_seconds=0, created_at=1.0)
    store.put_allocation(AllocationRow(owner="alice", **fields))
    store.put_allocation(AllocationRow(owner="bob", **{**fields, "handle": "2"}))
    assert store.allocation("dev", "alice").handle == "1" and store.allocation("dev", "bob").handle == "2"
    assert store.allocation("dev") is None  # the server's own account holds none of that name
    assert [r.owner for r in store.allocations("bob")] == ["bob"] and len(store.allocations()) == 2


def test_job_groups_from_before_0014_are_left_for_the_pass_to_clean(empty_url):
    """A job group's tasks recorded before the column get False (their host folders are still on the
    clusters), any other managed job NULL."""
    from alembic import command

    from corral.state.models import JobRow

    engine = create_engine(empty_url)
    with engine.begin() as conn:
        command.upgrade(migrations._config(conn), "0013")
        for job_id, parallel in (("c-g0", True), ("c-g1", True), ("c-solo", False)):
            conn.execute(JobRow.__table__.insert(), {"id": job_id, "name": "x", "task_json": "{}", "created_at": 1.0})
            conn.execute(text("INSERT INTO managed_jobs (job_id, state, restarts_on_errors, recoveries, moves, "
                              "last_move_at, cancel_requested, updated_at, pipeline_id, pipeline_parallel) VALUES "
                              "(:id, 'SUCCEEDED', 0, 0, 0, 0, false, 1.0, :pipeline, :parallel)"),
                         {"id": job_id, "pipeline": "c-g0" if parallel else None, "parallel": parallel})
    engine.dispose()
    store = Store(empty_url)
    assert {m.job_id: m.group_files_removed for m in store.managed()} == {"c-g0": False, "c-g1": False,
                                                                          "c-solo": None}
    assert store.ended_groups(1e10, 10) == {"c-g0": set()}  # no attempt: nothing on any cluster
