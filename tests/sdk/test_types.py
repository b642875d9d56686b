"""The SDK's typed results: states as enums that match the server's, and tolerant of newer servers."""

from __future__ import annotations

import json

from corral.infra.base import TERMINAL_JOB_STATES, JobState
from corral.sdk.types import (
    ENDED_STATES,
    MANAGED_ENDED_STATES,
    Job,
    JobStatus,
    ManagedJob,
    ManagedJobStatus,
)
from corral.state.models import MANAGED_TERMINAL_STATES, ManagedState

JOB = {"job_id": "c-1", "name": "n", "state": "FAILED", "cluster": "alpine", "partition": "cpu",
       "slurm_job_id": "7", "reason": None, "attempt": 1, "exit_code": 3}


def test_the_sdks_states_are_the_servers():
    assert [s.value for s in JobStatus] == [s.value for s in JobState]
    assert [s.value for s in ManagedJobStatus] == [s.value for s in ManagedState]
    assert {s.value for s in ENDED_STATES} == {s.value for s in TERMINAL_JOB_STATES}
    assert {s.value for s in MANAGED_ENDED_STATES} == {s.value for s in MANAGED_TERMINAL_STATES}


def test_a_state_is_a_member_that_still_compares_and_prints_as_its_name():
    job = Job.from_json(JOB)
    assert job.state is JobStatus.FAILED and job.state == "FAILED" and job.ended
    assert f"{job.state}" == "FAILED" and json.dumps({"s": job.state}) == '{"s": "FAILED"}'
    managed = ManagedJob.from_json({**JOB, "state": "RECOVERING"})
    assert managed.state is ManagedJobStatus.RECOVERING and not managed.ended


def test_a_state_this_client_does_not_know_stays_text_and_is_not_ended():
    job = Job.from_json({**JOB, "state": "PREEMPTED_LATER"})
    assert job.state == "PREEMPTED_LATER" and not isinstance(job.state, JobStatus) and not job.ended


def test_a_handle_is_read_by_its_name_or_from_an_older_server_by_slurm_job_id():
    from corral.sdk.types import Submission
    from corral.views import job_json

    pool_job = Job.from_json({**JOB, "handle": "lab1/d575218a0cac", "slurm_job_id": "lab1/d575218a0cac"})
    assert pool_job.handle == pool_job.slurm_job_id == "lab1/d575218a0cac"
    assert Job.from_json(JOB).handle == "7"  # an older server's answer: slurm_job_id only
    assert ManagedJob.from_json({**JOB, "state": "RUNNING", "handle": "9"}).slurm_job_id == "9"
    share = Submission.from_json({"job_ids": ["c-1"], "cluster": "alpine", "partition": "cpu", "handle": "12"})
    assert share.handle == share.slurm_job_id == "12"
    # the server says both, the same
    from corral.state.models import AttemptRow, JobRow
    from corral.state.store import JobView

    view = JobView(JobRow(id="c-1", name="n", created_at=0.0), AttemptRow(
        token="t", job_id="c-1", number=1, cluster="lab", partition="lab", state=JobState.RUNNING, created_at=0.0,
        run_dir="", log_path="", handle="lab1/d575218a0cac"))
    answer = job_json(view, {"lab": "ssh"})
    assert answer["handle"] == answer["slurm_job_id"] == "lab1/d575218a0cac" and answer["infra"] == "ssh/lab"
