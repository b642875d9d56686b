"""Recording managed jobs (corral/managed.py), on a real SQLite store: a pipeline is recorded whole or
not at all, and its name is one line, as a task's is."""

from __future__ import annotations

import pytest

from corral import managed
from corral.errors import TaskError
from corral.state import Store
from corral.task import parse_task


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'state.db'}")


def task(data: dict) -> tuple:
    return parse_task(data, "p.yaml"), "p.yaml"


def test_a_pipeline_is_recorded_in_order_under_its_first_tasks_id(store):
    ids = managed.record_pipeline(store, "pipe", [task({"name": "a", "run": "x"}), task({"run": "y"})])
    views = managed.views(store, ids)
    assert [(v.job.id, v.job.name, v.managed.pipeline_id, v.managed.pipeline_stage) for v in views] == [
        (ids[0], "a", ids[0], 0), (ids[1], "task", ids[0], 1)]
    assert {v.managed.pipeline_name for v in views} == {"pipe"}


@pytest.mark.parametrize("name", ["", "two\nlines", "x" * 201, "tab\there"])
def test_a_pipelines_name_is_one_line_of_text(store, name):
    with pytest.raises(TaskError, match="the pipeline's name .* must be one non-empty line"):
        managed.record_pipeline(store, name, [task({"run": "x"})])
    assert managed.views(store) == []


def test_a_task_that_cannot_be_recorded_records_none_of_the_pipeline(store):
    with pytest.raises(TaskError, match="envs.TOKEN"):  # a null env must come from --env
        managed.record_pipeline(store, "pipe", [task({"run": "x"}), task({"run": "y", "envs": {"TOKEN": None}})])
    assert managed.views(store) == []


def test_a_pipelines_name_means_the_callers_own_pipeline(store):
    """On a team server two users may each call a pipeline `pipe`: each one's name is theirs; an admin
    (no scope) is told the name is ambiguous rather than given either."""
    from corral.state.store import JobNotFoundError

    alice = managed.record_pipeline(store, "pipe", [task({"run": "a"}), task({"run": "b"})], owner="alice")
    bob = managed.record_pipeline(store, "pipe", [task({"run": "c"})], owner="bob")
    assert [v.job.id for v in managed.resolve_all(store, "pipe", scope="alice")] == alice
    assert managed.resolve(store, "pipe", scope="bob").job.id == bob[0]
    with pytest.raises(JobNotFoundError, match="'pipe' names several pipelines"):
        managed.resolve_all(store, "pipe", scope=None)
    with pytest.raises(JobNotFoundError, match="no managed job 'pipe'"):
        managed.resolve(store, "pipe", scope="carol")
