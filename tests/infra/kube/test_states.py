"""Corral's Jobs as statuses, from recorded Job, Pod and Event lists (tests/fixtures/kube/)."""

from __future__ import annotations

import json
from pathlib import Path

from corral.infra.base import FailureClass, JobState
from corral.infra.kube.states import epoch, statuses

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kube"


def items(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())["items"]


def by_handle() -> dict:
    return {s.handle.removeprefix("corral-")[:1]: s for s in statuses(items("jobs.json"), items("job-pods.json"),
                                                                       items("events.json"))}


def test_every_job_gets_one_status_with_its_token():
    found = statuses(items("jobs.json"), items("job-pods.json"), items("events.json"))
    assert len(found) == 10
    assert all(s.token == s.handle.removeprefix("corral-") for s in found)


def test_ended_jobs():
    s = by_handle()
    assert (s["a"].state, s["a"].exit_code, s["a"].ended_at) == (JobState.SUCCEEDED, 0, epoch("2026-12-01T10:02:00Z"))
    assert (s["b"].state, s["b"].failure, s["b"].exit_code, s["b"].reason) == (
        JobState.FAILED, FailureClass.TASK, 3, "exit code 3")
    # The node went away: the infrastructure's doing, whatever exit code the container was left with.
    assert (s["c"].state, s["c"].failure, s["c"].native_state, s["c"].reason) == (
        JobState.FAILED, FailureClass.INFRA, "DeletionByPodGC", "PodGC: node no longer exists")
    assert (s["g"].failure, s["g"].native_state) == (FailureClass.TASK, "DeadlineExceeded")  # its time limit
    assert (s["h"].failure, s["h"].exit_code, s["h"].reason) == (FailureClass.TASK, 137, "exit code 137 (out of memory)")
    assert s["j"].state is JobState.CANCELLED


def test_live_jobs_and_why_they_wait():
    s = by_handle()
    assert (s["d"].state, s["d"].started_at) == (JobState.RUNNING, epoch("2026-12-01T10:01:00Z"))  # the first pod's
    assert s["e"].state is JobState.PENDING
    assert s["e"].reason.startswith("FailedScheduling: 0/5 nodes are available: 5 Insufficient nvidia.com/gpu.")
    assert s["f"].reason == 'ImagePullBackOff: Back-off pulling image "nvcr.io/nvidia/pytorch:99.99"'
    assert s["i"].reason == "waiting for the Job controller to create its pods"


def test_without_events_the_pods_condition_says_why():
    found = {s.handle: s for s in statuses(items("jobs.json"), items("job-pods.json"))}
    assert found["corral-eeeeeeeeeeee"].reason.startswith("0/5 nodes are available")


def test_times():
    assert epoch("2026-12-01T10:00:00Z") == 1796119200.0
    assert epoch("not a time") is None and epoch(None) is None
