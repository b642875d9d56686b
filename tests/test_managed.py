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


def test_a_job_group_records_which_tasks_are_auxiliary_and_their_delays(store):
    ids = managed.record_pipeline(store, "grp", [task({"name": "train", "run": "x"}), task({"name": "data", "run": "y"}),
                                                 task({"name": "buffer", "run": "z"})],
                                  parallel=True, primary_tasks=["train"],
                                  termination_delay={"default": "30s", "buffer": "2m"})
    views = managed.views(store, ids)
    assert [(v.managed.pipeline_parallel, v.managed.termination_delay) for v in views] == [
        (True, None), (True, 30.0), (True, 120.0)]
    assert views[1].to_json()["pipeline"] == {"id": ids[0], "name": "grp", "task": 1, "execution": "parallel",
                                              "auxiliary": True}


@pytest.mark.parametrize("tasks, options, message", [
    ([{"name": "a", "run": "x"}, {"run": "y"}], {"parallel": True}, "task 1 has no `name`"),
    ([{"name": "a", "run": "x"}, {"name": "a", "run": "y"}], {"parallel": True}, "two tasks are named 'a'"),
    ([{"name": "a", "run": "x"}], {"primary_tasks": ["a"]}, "belong to a job group"),
    ([{"name": "a", "run": "x"}, {"name": "b", "run": "y"}],
     {"parallel": True, "primary_tasks": ["a"], "termination_delay": "soon"}, "'soon' is not a delay"),
])
def test_a_job_group_that_cannot_run_as_written_records_nothing(store, tasks, options, message):
    with pytest.raises(TaskError, match=message):
        managed.record_pipeline(store, "grp", [task(t) for t in tasks], **options)
    assert managed.views(store) == []


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
