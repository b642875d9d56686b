"""Corral's Jobs in a namespace as the seam's statuses (pure: from the API's Job, Pod and Event lists;
unit-tested on recorded lists).

- Complete: SUCCEEDED. Failed: FAILED, as the task's doing (a container's non-zero exit, its pod's
  or Job's deadline: the walltime) or the infrastructure's (a pod evicted, preempted or lost with its node:
  `INFRA_POD_REASONS`, or a `DisruptionTarget` condition), with the container's exit code.
- A pod running: RUNNING (since the first container started).
- Otherwise PENDING, with the reason a person needs: the scheduler's (`0/5 nodes are available:
  5 Insufficient nvidia.com/gpu.`), an image that cannot be pulled, a volume that cannot be mounted,
  from the pods' conditions and the newest Warning event about them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from corral.infra.base import FailureClass, JobState, JobStatus
from corral.infra.kube.manifests import LABEL_TOKEN

INFRA_POD_REASONS = frozenset({"Evicted", "NodeLost", "Preempting", "Shutdown", "NodeShutdown", "Terminated",
                               "UnexpectedAdmissionError", "OutOfcpu", "OutOfmemory", "OutOfnvidia.com/gpu"})
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


def epoch(stamp: object) -> float | None:
    """An RFC 3339 time from the API ("2026-12-01T11:02:03Z") in epoch seconds."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = (status.get("state") or {}).get("terminated")
        if ended:
            return ended
    return None


def _started(pods: Iterable[Mapping[str, Any]]) -> float | None:
    times = []
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            state = status.get("state") or {}
            times.append(epoch((state.get("running") or state.get("terminated") or {}).get("startedAt")))
    found = [t for t in times if t is not None]
    return min(found) if found else None


def _pending_reason(pods: list[Mapping[str, Any]], events: list[Mapping[str, Any]]) -> str:
    if not pods:
        return "waiting for the Job controller to create its pods"
    names = {p["metadata"]["name"] for p in pods}
    warnings = sorted((e for e in events if (e.get("involvedObject") or {}).get("name") in names
                       and e.get("type") == "Warning"),
                      key=lambda e: epoch(e.get("lastTimestamp") or e.get("eventTime")
                                          or (e.get("metadata") or {}).get("creationTimestamp")) or 0)
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                         "CreateContainerConfigError", "CreateContainerError"):
                return f"{waiting['reason']}: {waiting.get('message') or ''}".strip(": ")
    if warnings:
        latest = warnings[-1]
        return f"{latest.get('reason')}: {' '.join(str(latest.get('message') or '').split())}"
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("message") or condition.get("reason") or "not scheduled yet")
    phases = sorted({str((p.get("status") or {}).get("phase") or "Pending") for p in pods})
    return f"pods {', '.join(phases)}: starting"


def _failed(job: Mapping[str, Any], pods: list[Mapping[str, Any]], failed: Mapping[str, Any]
            ) -> tuple[str, str, FailureClass, int | None]:
    """(native state, reason, class, exit code) of a failed Job."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("reason") in INFRA_POD_REASONS or _condition(pod, "DisruptionTarget"):
            why = _condition(pod, "DisruptionTarget") or {}
            reason = status.get("message") or why.get("message") or status.get("reason") or why.get("reason")
            return str(status.get("reason") or why.get("reason") or "Disrupted"), str(reason), FailureClass.INFRA, None
    for pod in pods:  # the pod's own activeDeadlineSeconds (a task's --time): its walltime
        status = pod.get("status") or {}
        if status.get("reason") == "DeadlineExceeded":
            return "DeadlineExceeded", f"it reached its time limit: {status.get('message') or 'its deadline passed'}", \
                FailureClass.TASK, None
    codes = [(int(t.get("exitCode")), t) for p in pods if (t := _terminated(p)) and t.get("exitCode")]
    if failed.get("reason") == "DeadlineExceeded":
        return "DeadlineExceeded", str(failed.get("message") or "its time limit passed"), FailureClass.TASK, None
    if codes:
        code, ended = codes[0]
        reason = ended.get("reason") or "Error"
        return str(reason), f"exit code {code}" + (" (out of memory)" if reason == "OOMKilled" else ""), \
            FailureClass.TASK, code
    return str(failed.get("reason") or "Failed"), str(failed.get("message") or "the Job failed"), FailureClass.INFRA, None


def statuses(jobs: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
             events: Iterable[Mapping[str, Any]] = ()) -> list[JobStatus]:
    """One status per Corral Job (handle: the Job's name)."""
    by_job: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        owner = ((pod.get("metadata") or {}).get("labels") or {}).get(JOB_NAME_LABEL)
        if owner:
            by_job.setdefault(owner, []).append(pod)
    event_list = list(events)
    out = []
    for job in jobs:
        meta = job.get("metadata") or {}
        name = meta.get("name", "")
        token = (meta.get("labels") or {}).get(LABEL_TOKEN)
        status = job.get("status") or {}
        mine = sorted(by_job.get(name, []),
                      key=lambda p: int(((p.get("metadata") or {}).get("labels") or {}).get(INDEX_LABEL) or 0))
        submitted = epoch(meta.get("creationTimestamp"))
        started = epoch(status.get("startTime")) if status.get("active") or status.get("succeeded") else None
        started = _started(mine) or started
        ended = epoch(status.get("completionTime"))
        if meta.get("deletionTimestamp"):
            out.append(JobStatus(name, token, JobState.CANCELLED, "Deleting", "deleted", submitted, started,
                                 ended, None))
        elif _condition(job, "Complete"):
            out.append(JobStatus(name, token, JobState.SUCCEEDED, "Complete", None, submitted, started, ended, 0))
        elif (failed := _condition(job, "Failed")) is not None:
            native, reason, failure, code = _failed(job, mine, failed)
            out.append(JobStatus(name, token, JobState.FAILED, native, reason, submitted, started,
                                 epoch(failed.get("lastTransitionTime")) or ended, code, failure=failure))
        elif any((p.get("status") or {}).get("phase") == "Running" for p in mine):
            out.append(JobStatus(name, token, JobState.RUNNING, "Running", None, submitted, started, None, None))
        else:
            out.append(JobStatus(name, token, JobState.PENDING, "Pending", _pending_reason(mine, event_list),
                                 submitted, None, None, None))
    return out
