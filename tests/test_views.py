"""Explanations for people (corral/views.py): why a pending managed job waits where it is."""

from __future__ import annotations

from corral.controller.rules import ControllerSettings
from corral.infra.base import JobState
from corral.managed import ManagedView
from corral.placement import Candidate, Plan
from corral.state.models import AttemptRow, JobRow, ManagedJobRow, ManagedState
from corral.task import parse_task, resource_options
from corral.views import explain_pending

[OPTION] = resource_options(parse_task({"run": "x"}, "t").resources)


def pending(**managed: object) -> ManagedView:
    job = JobRow(id="c-1", name="server", owner="", created_at=0.0, job_rank=0)
    row = ManagedJobRow(job_id="c-1", state=ManagedState.PENDING, reason=None, restarts_on_errors=0, recoveries=0,
                        moves=0, last_move_at=0.0, cancel_requested=False, **managed)
    attempt = AttemptRow(token="t1", job_id="c-1", number=1, cluster="alpine", partition="gpu", handle="7",
                         state=JobState.PENDING, reason="Resources", run_dir="", log_path="", expected_start=None)
    return ManagedView(job, row, [attempt])


PLAN = Plan([Candidate("alpine", "gpu", OPTION, True), Candidate("cirrus", "b300", OPTION, True, startable_now=True)])


def test_a_job_another_cluster_can_start_now_will_move():
    lines = explain_pending(pending(), PLAN, ControllerSettings())
    assert lines[0] == "c-1 is pending on slurm/alpine/gpu: Resources"
    assert lines[-1].startswith("  not moved because: it will move on the controller's next tick")


def test_a_job_groups_task_says_it_stays_with_its_group():
    lines = explain_pending(pending(pipeline_parallel=True, pipeline_name="rl", pipeline_id="c-0"), PLAN,
                            ControllerSettings())
    assert lines[-2] == "  best alternative: slurm/cirrus/b300, start now"
    assert lines[-1] == ("  not moved because: it is a task of job group rl, which runs on one cluster: its tasks "
                         "stay where the others can reach them")
