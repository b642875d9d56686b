"""A FAKE Kubernetes API server, for testing the `k8s/<context>` backend where no real Kubernetes can be
installed. It is not Kubernetes: it serves the handful of REST paths a client of Jobs uses, with the
real API's shapes (lists, Status errors, Indexed Job pods and labels, conditions, FailedScheduling
events), and plays the parts behind them in one process:

- a scheduler that binds pending pods to nodes whose allocatable (`cpu`, `memory`, `nvidia.com/gpu`)
  minus the requests of the pods bound there fits, and whose labels match the pod's `nodeSelector`;
  otherwise the pod's `PodScheduled` condition and a Warning event say `0/N nodes are available: …`;
- a Job controller for Indexed Jobs (`completions` pods, `JOB_COMPLETION_INDEX`, hostname
  `<job>-<index>` under `subdomain`, `backoffLimit: 0` honoured: the first failed pod fails the Job and
  ends the others);
- a kubelet that runs each pod's command as a local process (the image is NOT pulled or used: the
  command runs with this host's bash), as user corral-test, in its own mount and UTS namespaces: a
  private tmpfs `/tmp`, `HOME=/tmp/home`, the pod's hostname, its configMap, secret, emptyDir and hostPath volumes
  bind-mounted at their mountPaths (created on the host if missing; not under /tmp), its GPUs as
  `NVIDIA_VISIBLE_DEVICES` (what the device plugin would hand over), its `activeDeadlineSeconds` enforced
  from its start (the pod fails with reason `DeadlineExceeded`). Logs are its output.

No DNS, no networking between pods, no TTL controller, no admission beyond a few checks;
merge patches only; the garbage collector removes what a deleted object owned. A Secret's `stringData`
is stored base64-encoded under `data`, as the API does; a DELETE without a name deletes the collection
its `labelSelector` selects (equality and set-based terms: `key in (a,b)`, `key notin (a)`).
Nodes come from `--nodes` (JSON). `POST /fake/nodes/<name>/lose` takes a node away as a crashed one
goes: its pods fail with a `DisruptionTarget` condition (`.../restore` brings it back).
`POST /fake/forbid/<resource>/on` takes every right on that resource from the client's role: a create
answers RBAC's 403, and the RBAC reviews (SelfSubjectRulesReview, SelfSubjectAccessReview) say so
(`.../off` gives them back). `GET /fake/requests` lists every request
served (tests count round trips with it). Lists and watches (`?watch=true` from a resourceVersion,
with bookmarks, 410 once the change log no longer reaches back) are served as the API serves them. `FakeKubernetes` starts and stops one for tests. Run: `python -m testbed.kubeapi --port P
--token T --root DIR`.
"""

from __future__ import annotations

import argparse
import base64
import collections
import copy
import json
import os
import re
import secrets
import signal
import subprocess
import threading
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from testbed.spec import TEST_USER

GPU = "nvidia.com/gpu"
DEFAULT_NODES = [
    {"name": "kn1", "cpu": "16", "memory": "64Gi", "gpus": 4, "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
    {"name": "kn2", "cpu": "16", "memory": "64Gi", "gpus": 4, "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
    {"name": "kn3", "cpu": "8", "memory": "32Gi", "gpus": 2, "labels": {"cloud.google.com/gke-accelerator": "nvidia-l4"}},
    {"name": "kn4", "cpu": "8", "memory": "32Gi", "gpus": 0, "labels": {}},
]
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_SUFFIX = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40}
POD_SETUP = """set -e
hostname "$1"; shift
while [ "$1" != -- ]; do mkdir -p "$2"; mount --bind "$1" "$2"; shift 2; done; shift
mount -t tmpfs -o mode=1777 tmpfs /tmp
install -d -o "$FAKE_POD_USER" /tmp/home
exec setpriv --reuid="$FAKE_POD_USER" --regid="$FAKE_POD_USER" --init-groups -- "$@"
"""


def now_text() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def quantity(text: object) -> Decimal:
    match = re.match(r"^([0-9.]+)([a-zA-Z]*)$", str(text))
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"quantities must match the regular expression: {text!r}")
    return Decimal(match.group(1)) * _SUFFIX[match.group(2)]


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def body(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": self.reason, "code": self.code}


class Cluster:
    """The objects, and the scheduler, Job controller and kubelet that act on them (under one lock)."""

    def __init__(self, root: Path, nodes: list[dict[str, Any]]):
        self.root = root
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, namespace, name)
        self.version = 0
        self.processes: dict[str, subprocess.Popen[bytes]] = {}  # pod uid -> its process
        self.devices: dict[str, dict[int, str]] = {}  # node -> GPU index -> pod uid
        self.killing: dict[str, float] = {}  # pod uid -> when TERM was sent
        self.deadlines: dict[str, float] = {}  # pod uid -> when its activeDeadlineSeconds run out (monotonic)
        self.requests: list[str] = []  # "METHOD path" of every request, for tests that count them
        self.forbidden: set[str] = set()  # resources (`secrets`, …) the client's role may not create
        self.event_times: dict[tuple[str, str, str], float] = {}  # an Event's last update
        self.changelog: collections.deque[tuple[int, str, tuple[str, str, str], dict[str, Any]]] = collections.deque(
            maxlen=20000)  # (resourceVersion, ADDED/MODIFIED/DELETED, key, object) for watches
        for spec in nodes:
            self._add_node(spec)

    # ---- objects ------------------------------------------------------------------------------------------
    def _stamp(self, obj: dict[str, Any]) -> None:
        """A new resourceVersion for a changed object, and its watch event (ADDED before it is stored)."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        key = (obj.get("kind", ""), obj["metadata"].get("namespace", ""), obj["metadata"].get("name", ""))
        self.changelog.append((self.version, "MODIFIED" if key in self.objects else "ADDED", key, copy.deepcopy(obj)))

    def _remove(self, key: tuple[str, str, str]) -> None:
        obj = self.objects.pop(key, None)
        if obj is not None:
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.changelog.append((self.version, "DELETED", key, copy.deepcopy(obj)))

    def changes(self, after: int, kind: str, namespace: str | None, labels: str) -> tuple[list[dict[str, Any]], int]:
        """Watch events after resourceVersion `after` (ERROR 410 when the log no longer reaches back so
        far), and the version they bring the watcher to."""
        with self.lock:
            if self.changelog and after < self.changelog[0][0] - 1:
                return [{"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                     "code": 410, "reason": "Expired",
                                                     "message": f"too old resource version: {after}"}}], after
            out = [{"type": event, "object": obj} for version, event, key, obj in self.changelog
                   if version > after and key[0] == kind and (namespace is None or key[1] == namespace)
                   and _labels_match(obj, labels)]
            return out, self.version

    def _add_node(self, spec: dict[str, Any]) -> None:
        allocatable = {"cpu": spec["cpu"], "memory": spec["memory"], "pods": "110"}
        if spec.get("gpus"):
            allocatable[GPU] = str(spec["gpus"])
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": spec["name"], "uid": str(uuid.uuid4()), "creationTimestamp": now_text(),
                             "labels": {"kubernetes.io/hostname": spec["name"], **spec.get("labels", {})}},
                "spec": {}, "status": {"capacity": dict(allocatable), "allocatable": allocatable,
                                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                       "message": "kubelet is posting ready status"}]}}
        self._stamp(node)
        self.objects[("Node", "", spec["name"])] = node
        self.devices[spec["name"]] = {}

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiError(400, "BadRequest", f"{kind} in body is invalid: metadata is required")
        name = body["metadata"].get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: metadata.name: Invalid value: "{name}": a '
                                           "lowercase RFC 1123 label must consist of lower case alphanumeric "
                                           "characters or '-'")
        if kind == "Job":
            self._validate_job(name, body)
        with self.lock:
            if (kind, namespace, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists')
            obj = copy.deepcopy(body)
            obj["metadata"].update({"namespace": namespace, "uid": str(uuid.uuid4()), "creationTimestamp": now_text()})
            if kind == "Job":
                obj["status"] = {}
            if kind == "Secret":  # the API keeps only `data`
                obj["data"] = {**(obj.get("data") or {}), **{k: base64.b64encode(str(v).encode()).decode()
                                                             for k, v in (obj.pop("stringData", None) or {}).items()}}
            self._stamp(obj)
            self.objects[(kind, namespace, name)] = obj
            return copy.deepcopy(obj)

    def _validate_job(self, name: str, body: dict[str, Any]) -> None:
        spec = body.get("spec") or {}
        containers = (((spec.get("template") or {}).get("spec") or {}).get("containers")) or []
        if not containers or not all(c.get("image") for c in containers):
            raise ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: spec.template.spec.containers[0].image: '
                                           "Required value")
        if spec.get("completionMode") == "Indexed" and not spec.get("completions"):
            raise ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: spec.completions: Required value: when '
                                           "completion mode is Indexed")
        for container in containers:
            for value in ((container.get("resources") or {}).get("requests") or {}).values():
                try:
                    quantity(value)
                except ValueError as exc:
                    raise ApiError(422, "Invalid", f'Job.batch "{name}" is invalid: {exc}') from None

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            obj = self.objects.get((kind, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            return copy.deepcopy(obj)

    def list(self, kind: str, namespace: str | None, labels: str, fields: str) -> dict[str, Any]:
        with self.lock:
            items = [copy.deepcopy(o) for (k, ns, _), o in sorted(self.objects.items())
                     if k == kind and (namespace is None or ns == namespace)
                     and _labels_match(o, labels) and _fields_match(o, fields)]
            return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.version)},
                    "items": items}

    def patch(self, kind: str, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386), as `application/merge-patch+json` asks."""
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the patch is not a JSON object")
        with self.lock:
            obj = self.objects.get((kind, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            _merge_patch(obj, body)
            self._stamp(obj)
            return copy.deepcopy(obj)

    def delete(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            obj = self.objects.get((kind, namespace, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            self._remove((kind, namespace, name))
            uid = obj["metadata"].get("uid")
            for key, other in list(self.objects.items()):  # the garbage collector: what it owned goes too
                if key[0] != "Pod" and any(ref.get("uid") == uid for ref in other["metadata"].get("ownerReferences")
                                           or []):
                    self._remove(key)
            if kind == "Job":  # propagation: its pods go too (ended now, removed once their process is gone)
                for (k, ns, _), pod in list(self.objects.items()):
                    if k == "Pod" and ns == namespace and pod["metadata"]["labels"].get("job-name") == name:
                        pod["metadata"]["deletionTimestamp"] = now_text()
                        self._stamp(pod)
            return {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name}}

    def delete_collection(self, kind: str, namespace: str, labels: str) -> dict[str, Any]:
        """Every object of `kind` in `namespace` that `labels` selects, deleted as `delete` does each."""
        with self.lock:
            chosen = [o for (k, ns, _), o in sorted(self.objects.items())
                      if k == kind and ns == namespace and _labels_match(o, labels)]
            for obj in chosen:
                self.delete(kind, namespace, obj["metadata"]["name"])
            return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": chosen}

    def event(self, namespace: str, pod: dict[str, Any], reason: str, message: str) -> None:
        name = f"{pod['metadata']['name']}.{reason.lower()}"
        key = ("Event", namespace, name)
        existing = self.objects.get(key)
        if existing and existing["message"] == message:
            if time.time() - self.event_times.get(key, 0) < 5:  # as the scheduler retries: not every tick
                return
            self.event_times[key] = time.time()
            existing["count"] += 1
            existing["lastTimestamp"] = now_text()
            self._stamp(existing)
            return
        event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": namespace,
                                                                    "creationTimestamp": now_text()},
                 "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": namespace},
                 "reason": reason, "message": message, "type": "Warning", "count": 1,
                 "firstTimestamp": now_text(), "lastTimestamp": now_text()}
        self._stamp(event)
        self.objects[key] = event

    def _set_ready(self, name: str, ready: bool) -> None:
        node = self.objects.get(("Node", "", name))
        if node is None:
            raise ApiError(404, "NotFound", f'nodes "{name}" not found')
        node["status"]["conditions"] = [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
            if ready else {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                           "message": "Kubelet stopped posting node status."}]
        self._stamp(node)

    def lose_node(self, name: str) -> None:
        with self.lock:
            self._set_ready(name, False)
            for (kind, _, _), pod in self.objects.items():
                if kind == "Pod" and pod["spec"].get("nodeName") == name and pod["status"]["phase"] in ("Pending",
                                                                                                          "Running"):
                    self._stop(pod, signal.SIGKILL)
                    pod["status"]["phase"] = "Failed"
                    pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                                        "reason": "DeletionByPodGC",
                                                        "message": "PodGC: node no longer exists"})
                    self._stamp(pod)

    def restore_node(self, name: str) -> None:
        with self.lock:
            self._set_ready(name, True)

    # ---- the controllers ------------------------------------------------------------------------------------
    def tick(self) -> None:
        with self.lock:
            for key, obj in list(self.objects.items()):
                if key[0] == "Job":
                    self._job(key[1], obj)
            for key, obj in list(self.objects.items()):
                if key[0] == "Pod":
                    self._pod(key[1], obj)

    def _pods_of(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return [o for (k, ns, _), o in self.objects.items()
                if k == "Pod" and ns == namespace and o["metadata"]["labels"].get("job-name") == job]

    def _job(self, namespace: str, job: dict[str, Any]) -> None:
        name, spec, status = job["metadata"]["name"], job["spec"], job["status"]
        if any(c["type"] in ("Complete", "Failed") for c in status.get("conditions", [])):
            return
        before = json.dumps(status, sort_keys=True)
        pods = self._pods_of(namespace, name)
        completions = int(spec.get("completions") or 1)
        have = {p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in pods}
        for index in range(completions):
            if str(index) not in have:
                self._create_pod(namespace, job, index)
        pods = self._pods_of(namespace, name)
        status.setdefault("startTime", now_text())
        failed = [p for p in pods if p["status"]["phase"] == "Failed"]
        succeeded = {p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in pods
                     if p["status"]["phase"] == "Succeeded"}
        status.update(active=sum(1 for p in pods if p["status"]["phase"] in ("Pending", "Running")),
                      succeeded=len(succeeded), failed=len(failed),
                      ready=sum(1 for p in pods if p["status"]["phase"] == "Running"))
        if len(failed) > int(spec.get("backoffLimit", 6)):
            for pod in pods:
                self._stop(pod, signal.SIGTERM)
            status["conditions"] = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                     "message": "Job has reached the specified backoff limit",
                                     "lastTransitionTime": now_text()}]
        elif len(succeeded) >= completions:
            status["completionTime"] = now_text()
            status["conditions"] = [{"type": "Complete", "status": "True", "lastTransitionTime": now_text()}]
        if json.dumps(status, sort_keys=True) != before:
            self._stamp(job)

    def _create_pod(self, namespace: str, job: dict[str, Any], index: int) -> None:
        name = job["metadata"]["name"]
        template = copy.deepcopy(job["spec"]["template"])
        meta = template.get("metadata") or {}
        pod_name = f"{name}-{index}-{secrets.token_hex(3)[:5]}"
        labels = {**(meta.get("labels") or {}), "batch.kubernetes.io/job-name": name, "job-name": name,
                  "batch.kubernetes.io/job-completion-index": str(index),
                  "batch.kubernetes.io/controller-uid": job["metadata"]["uid"]}
        spec = template["spec"]
        if spec.get("subdomain"):
            spec["hostname"] = f"{name}-{index}"
        for container in spec["containers"]:
            container.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "value": str(index)})
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod_name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": labels,
                            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                            "creationTimestamp": now_text(),
                            "ownerReferences": [{"kind": "Job", "name": name, "uid": job["metadata"]["uid"]}]},
               "spec": spec, "status": {"phase": "Pending", "conditions": []}}
        self._stamp(pod)
        self.objects[("Pod", namespace, pod_name)] = pod

    def _requests(self, pod: dict[str, Any]) -> dict[str, Decimal]:
        total: dict[str, Decimal] = {}
        for container in pod["spec"]["containers"]:
            resources = container.get("resources") or {}
            for key, value in {**(resources.get("limits") or {}), **(resources.get("requests") or {})}.items():
                total[key] = total.get(key, Decimal(0)) + quantity(value)
        return total

    def _pod(self, namespace: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if pod["metadata"].get("deletionTimestamp"):
            self._stop(pod, signal.SIGTERM)
            self._reap(pod)
            if uid not in self.processes:
                self._remove(("Pod", namespace, pod["metadata"]["name"]))
            return
        phase = pod["status"]["phase"]
        if phase == "Pending" and not pod["spec"].get("nodeName"):
            self._schedule(namespace, pod)
        elif phase == "Pending":
            self._start(namespace, pod)
        elif phase == "Running":
            deadline = self.deadlines.get(uid)
            if deadline is not None and time.monotonic() >= deadline:  # the kubelet's active deadline
                del self.deadlines[uid]
                pod["status"].update(reason="DeadlineExceeded",
                                     message="Pod was active on the node longer than the specified deadline")
                self._stop(pod, signal.SIGTERM)
            self._reap(pod)

    def _schedule(self, namespace: str, pod: dict[str, Any]) -> None:
        wanted = self._requests(pod)
        selector = pod["spec"].get("nodeSelector") or {}
        nodes = [o for (k, _, _), o in self.objects.items() if k == "Node"]
        why: dict[str, int] = {}
        for node in nodes:
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
            if not ready:
                why["node(s) had untolerated taint {node.kubernetes.io/unreachable: }"] = why.get(
                    "node(s) had untolerated taint {node.kubernetes.io/unreachable: }", 0) + 1
                continue
            if any(node["metadata"]["labels"].get(k) != v for k, v in selector.items()):
                why["node(s) didn't match Pod's node affinity/selector"] = why.get(
                    "node(s) didn't match Pod's node affinity/selector", 0) + 1
                continue
            used: dict[str, Decimal] = {}
            for (k, _, _), other in self.objects.items():
                if k == "Pod" and other["spec"].get("nodeName") == node["metadata"]["name"] and \
                        other["status"]["phase"] in ("Pending", "Running"):
                    for key, value in self._requests(other).items():
                        used[key] = used.get(key, Decimal(0)) + value
            short = [key for key, value in wanted.items()
                     if used.get(key, Decimal(0)) + value > quantity(node["status"]["allocatable"].get(key, "0"))]
            if short:
                for key in short:
                    why[f"Insufficient {key}"] = why.get(f"Insufficient {key}", 0) + 1
                continue
            pod["spec"]["nodeName"] = node["metadata"]["name"]
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
            self._stamp(pod)
            return
        message = f"0/{len(nodes)} nodes are available: " + ", ".join(f"{n} {w}" for w, n in sorted(why.items())) + \
            f". preemption: 0/{len(nodes)} nodes are available: {len(nodes)} Preemption is not helpful for scheduling."
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        if pod["status"]["conditions"] != [condition]:
            pod["status"]["conditions"] = [condition]
            self._stamp(pod)
        self.event(namespace, pod, "FailedScheduling", message)

    def _start(self, namespace: str, pod: dict[str, Any]) -> None:
        uid, spec = pod["metadata"]["uid"], pod["spec"]
        directory = self.root / "pods" / uid
        mounts: list[str] = []
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        sources: dict[str, Path] = {}
        for volume in volumes.values():
            source = sources[volume["name"]] = directory / "volumes" / volume["name"]
            if "hostPath" in volume:  # the node's own path: how a pod_config mounts a shared filesystem here
                sources[volume["name"]] = Path(volume["hostPath"]["path"])
                continue
            source.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume or "secret" in volume:
                kind, wanted = (("ConfigMap", volume["configMap"]["name"]) if "configMap" in volume
                                else ("Secret", volume["secret"]["secretName"]))
                found = self.objects.get((kind, namespace, wanted))
                if found is None:
                    self.event(namespace, pod, "FailedMount", f'MountVolume.SetUp failed for volume "{volume["name"]}" '
                                                              f': {kind.lower()} "{wanted}" not found')
                    return
                for key, text in (found.get("data") or {}).items():
                    if kind == "Secret":
                        (source / key).write_bytes(base64.b64decode(text))
                    else:
                        (source / key).write_text(text)
                for key, data in (found.get("binaryData") or {}).items():
                    (source / key).write_bytes(base64.b64decode(data))
            else:
                os.chown(source, *_user_ids())
        container = spec["containers"][0]
        for mount in container.get("volumeMounts") or []:
            if mount["name"] in sources:
                mounts += [str(sources[mount["name"]]), mount["mountPath"]]
        node = spec["nodeName"]
        gpus = int(self._requests(pod).get(GPU, 0))
        free = [i for i in range(int(quantity(self.objects[("Node", "", node)]["status"]["allocatable"].get(GPU, "0"))))
                if i not in self.devices[node]]
        picked = free[:gpus]
        for index in picked:
            self.devices[node][index] = uid
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp/home",
               "HOSTNAME": spec.get("hostname") or pod["metadata"]["name"], "FAKE_POD_USER": TEST_USER}
        if gpus:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(map(str, picked))
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        log = directory / "log"
        directory.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.processes[uid] = subprocess.Popen(
                ["unshare", "--mount", "--uts", "--propagation", "private", "--", "/bin/bash", "-c", POD_SETUP,
                 "fake-pod", env["HOSTNAME"], *mounts, "--", *argv],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if pod["spec"].get("activeDeadlineSeconds"):
            self.deadlines[uid] = time.monotonic() + float(pod["spec"]["activeDeadlineSeconds"])
        pod["status"].update(phase="Running", podIP="127.0.0.1", startTime=now_text(), containerStatuses=[
            {"name": container["name"], "ready": True, "restartCount": 0, "image": container["image"],
             "state": {"running": {"startedAt": now_text()}}}])
        self._stamp(pod)

    def _reap(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        process = self.processes.get(uid)
        if process is None:
            return
        killed_at = self.killing.get(uid)
        if killed_at and time.monotonic() - killed_at > 5:
            _signal(process, signal.SIGKILL)
        code = process.poll()
        if code is None:
            return
        self._ended(pod, code if code >= 0 else 128 - code)

    def _ended(self, pod: dict[str, Any], code: int) -> None:
        uid = pod["metadata"]["uid"]
        self.processes.pop(uid, None)
        self.killing.pop(uid, None)
        self.deadlines.pop(uid, None)
        node = pod["spec"].get("nodeName")
        if node:
            self.devices[node] = {i: u for i, u in self.devices[node].items() if u != uid}
        if pod["status"]["phase"] != "Running":
            return
        started = pod["status"]["containerStatuses"][0]["state"].get("running", {}).get("startedAt", now_text())
        pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        pod["status"]["containerStatuses"][0]["state"] = {"terminated": {
            "exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": started,
            "finishedAt": now_text()}}
        self._stamp(pod)

    def _stop(self, pod: dict[str, Any], sig: int) -> None:
        uid = pod["metadata"]["uid"]
        process = self.processes.get(uid)
        if process is None or (sig == signal.SIGTERM and uid in self.killing):
            return
        _signal(process, sig)
        self.killing.setdefault(uid, time.monotonic())
        if sig == signal.SIGKILL:
            process.wait(timeout=5)
            self._ended(pod, 137)

    def log(self, namespace: str, name: str) -> tuple[Path, subprocess.Popen[bytes] | None]:
        with self.lock:
            pod = self.objects.get(("Pod", namespace, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            if pod["status"]["phase"] == "Pending":
                raise ApiError(400, "BadRequest", f'container "task" in pod "{name}" is waiting to start: '
                                                  "ContainerCreating")
            uid = pod["metadata"]["uid"]
            return self.root / "pods" / uid / "log", self.processes.get(uid)

    def shutdown(self) -> None:
        with self.lock:
            for process in self.processes.values():
                _signal(process, signal.SIGKILL)


def _signal(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _user_ids() -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(TEST_USER)
    return entry.pw_uid, entry.pw_gid


def _merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _labels_match(obj: dict[str, Any], selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in re.split(r",(?![^()]*\))", selector))):
        if match := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^()]*)\)", term):
            key, operator, values = match.groups()
            if (labels.get(key) in {v.strip() for v in values.split(",")}) != (operator == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _field(obj: dict[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _fields_match(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field(obj, key) == value:
                return False
        else:
            key, value = term.replace("==", "=").split("=", 1)
            if _field(obj, key) != value:
                return False
    return True


ROUTES = [
    (re.compile(r"^/api/v1/nodes$"), "Node", False),
    (re.compile(r"^/api/v1/pods$"), "Pod", False),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?$"), "Pod", True),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/events$"), "Event", True),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps(?:/([^/]+))?$"), "ConfigMap", True),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?$"), "Secret", True),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/services(?:/([^/]+))?$"), "Service", True),
    (re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?$"), "Job", True),
]
LOG_ROUTE = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")
NODE_ROUTE = re.compile(r"^/fake/nodes/([^/]+)/(lose|restore)$")
FORBID_ROUTE = re.compile(r"^/fake/forbid/([a-z/]+)/(on|off)$")
REVIEW_ROUTES = ("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                 "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
# What the fake's rules review names per API group once a resource is forbidden.
REVIEWED = {"": ["configmaps", "secrets", "services", "pods", "pods/log", "events"], "batch": ["jobs"]}


def make_handler(cluster: Cluster, token: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw) if raw else None
            except ValueError:
                raise ApiError(400, "BadRequest", "the body is not JSON") from None

        def _handle(self, method: str) -> None:
            with cluster.lock:
                cluster.requests.append(f"{method} {urlparse(self.path).path}")
            try:
                if self.headers.get("Authorization") != f"Bearer {token}":
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                url = urlparse(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                body = self._body() if method in ("POST", "DELETE", "PATCH") else None
                if url.path == "/version":
                    return self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-corral-fake"})
                if method == "GET" and url.path == "/fake/requests":
                    with cluster.lock:
                        return self._send(200, list(cluster.requests))
                if method == "POST" and (match := NODE_ROUTE.match(url.path)):
                    (cluster.lose_node if match.group(2) == "lose" else cluster.restore_node)(match.group(1))
                    return self._send(200, {"kind": "Status", "status": "Success"})
                if method == "POST" and (match := FORBID_ROUTE.match(url.path)):
                    (cluster.forbidden.add if match.group(2) == "on" else cluster.forbidden.discard)(match.group(1))
                    return self._send(200, {"kind": "Status", "status": "Success"})
                if method == "POST" and url.path in REVIEW_ROUTES:
                    return self._send(201, self._review(url.path, body or {}))
                resource = url.path.rstrip("/").split("/")[-1]
                if method == "POST" and resource in cluster.forbidden:  # as RBAC answers a role without `create`
                    namespace = url.path.split("/namespaces/")[-1].split("/")[0]
                    raise ApiError(403, "Forbidden", f'{resource} is forbidden: User "system:serviceaccount:'
                                                     f'{namespace}:corral" cannot create resource "{resource}" in '
                                                     f'API group "" in the namespace "{namespace}"')
                if method == "GET" and (match := LOG_ROUTE.match(url.path)):
                    tail = query.get("tailLines", "")
                    return self._log(match.group(1), match.group(2), query.get("follow") == "true",
                                     int(tail) if tail.isdigit() else None)
                for pattern, kind, namespaced in ROUTES:
                    match = pattern.match(url.path)
                    if not match:
                        continue
                    namespace = match.group(1) if namespaced else None
                    name = match.group(2) if namespaced and match.lastindex and match.lastindex >= 2 else None
                    if method == "GET" and name:
                        return self._send(200, cluster.get(kind, namespace or "", name))
                    if method == "GET" and query.get("watch") == "true":
                        return self._watch(kind, namespace, query)
                    if method == "GET":
                        return self._send(200, cluster.list(kind, namespace, query.get("labelSelector", ""),
                                                            query.get("fieldSelector", "")))
                    if method == "POST" and not name and namespace:
                        return self._send(201, cluster.create(kind, namespace, body))
                    if method == "DELETE" and name and namespace:
                        return self._send(200, cluster.delete(kind, namespace, name))
                    if method == "DELETE" and namespace:
                        return self._send(200, cluster.delete_collection(kind, namespace,
                                                                         query.get("labelSelector", "")))
                    if method == "PATCH" and name and namespace:
                        if "merge-patch" not in (self.headers.get("Content-Type") or ""):
                            raise ApiError(415, "UnsupportedMediaType", "the fake takes merge patches only")
                        return self._send(200, cluster.patch(kind, namespace, name, body))
                    raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {url.path}")
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            except ApiError as exc:
                self._send(exc.code, exc.body())
            except Exception as exc:  # a bug of the fake: a 500 with the reason, not a dropped connection
                self._send(500, ApiError(500, "InternalError", f"the fake failed: {exc!r}").body())

        def _review(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
            """A rules review: every verb on every resource, or, once some are forbidden, rules naming
            each other resource; an access review: allowed unless its resource is forbidden."""
            with cluster.lock:
                forbidden = set(cluster.forbidden)
            spec = body.get("spec") or {}
            if path.endswith("selfsubjectaccessreviews"):
                attributes = spec.get("resourceAttributes") or {}
                resource = "/".join(filter(None, (attributes.get("resource"), attributes.get("subresource"))))
                status: dict[str, Any] = {"allowed": resource not in forbidden}
            elif not forbidden:
                status = {"resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                          "nonResourceRules": [], "incomplete": False}
            else:
                rules = [{"verbs": ["*"], "apiGroups": [group], "resources": sorted(set(names) - forbidden)}
                         for group, names in REVIEWED.items()]
                status = {"resourceRules": rules, "nonResourceRules": [], "incomplete": False}
            return {**body, "status": status}

        def _watch(self, kind: str, namespace: str | None, query: dict[str, str]) -> None:
            """Events as JSON lines from `resourceVersion` on, until `timeoutSeconds` or the client goes."""
            version = int(query.get("resourceVersion") or cluster.version)
            ends = time.monotonic() + min(float(query.get("timeoutSeconds") or 300), 1800)
            bookmark = time.monotonic()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while time.monotonic() < ends:
                    events, version = cluster.changes(version, kind, namespace, query.get("labelSelector", ""))
                    if query.get("allowWatchBookmarks") == "true" and time.monotonic() - bookmark > 5:
                        events.append({"type": "BOOKMARK", "object": {"kind": kind,
                                                                      "metadata": {"resourceVersion": str(version)}}})
                        bookmark = time.monotonic()
                    for event in events:
                        line = json.dumps(event).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    if any(e["type"] == "ERROR" for e in events):
                        break
                    time.sleep(0.1)
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the watcher went away
                self.close_connection = True

        def _log(self, namespace: str, name: str, follow: bool, tail: int | None = None) -> None:
            """The pod's log, as the API streams it: with `tailLines`, its last lines first."""
            path, process = cluster.log(namespace, name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with open(path, "rb") as source:
                if tail is not None:
                    last = b"".join(collections.deque(source, maxlen=tail))  # lines so far; the rest follows
                    if last:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(last), last))
                while True:
                    ended = not follow or process is None or process.poll() is not None
                    chunk = source.read()  # after `ended`: what the process wrote last is read too
                    if chunk:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    if ended:
                        break
                    time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")

        def do_GET(self) -> None:  # noqa: N802
            self._handle("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._handle("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self._handle("DELETE")

        def do_PATCH(self) -> None:  # noqa: N802
            self._handle("PATCH")

    return Handler


def write_kubeconfig(path: Path, context: str, port: int, token: str, namespace: str = "default") -> None:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": context, "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": f"{context}-user", "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": f"{context}-user",
                                                   "namespace": namespace}}],
    }, indent=1))


class FakeKubernetes:
    """One fake API server in its own process (its pods are its children), with a kubeconfig for it."""

    def __init__(self, root: Path, context: str = "kind-fake", token: str | None = None):
        self.root = root
        self.context = context
        self.token = token or secrets.token_hex(16)
        self.kubeconfig = root / "kubeconfig"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def up(self) -> None:
        import socket
        import sys

        self.root.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        log = open(self.root / "server.log", "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "testbed.kubeapi", "--port", str(self.port),
                                         "--token", self.token, "--root", str(self.root)],
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        cwd=Path(__file__).resolve().parent.parent)
        log.close()
        deadline = time.monotonic() + 20
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fake Kubernetes API server did not start; see {self.root / 'server.log'}")
            time.sleep(0.1)
        write_kubeconfig(self.kubeconfig, self.context, self.port, self.token)

    def _answers(self) -> bool:
        try:
            self.request("GET", "/version")
            return True
        except OSError:
            return False

    def request(self, method: str, path: str) -> Any:
        from urllib.request import Request, urlopen

        asked = Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                        headers={"Authorization": f"Bearer {self.token}"})
        with urlopen(asked, timeout=5) as answer:
            return json.loads(answer.read())

    def requests(self) -> list[str]:
        return [r for r in self.request("GET", "/fake/requests") if not r.startswith(("GET /fake/", "GET /version"))]

    def lose_node(self, name: str) -> None:
        self.request("POST", f"/fake/nodes/{name}/lose")

    def restore_node(self, name: str) -> None:
        self.request("POST", f"/fake/nodes/{name}/restore")

    def forbid(self, resource: str, forbidden: bool = True) -> None:
        """Take every right on `resource` (`secrets`, `pods/log`, …) from the client's role: a create
        answers 403, and the RBAC reviews leave it out."""
        self.request("POST", f"/fake/forbid/{resource}/{'on' if forbidden else 'off'}")

    def down(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m testbed.kubeapi", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--nodes", help="JSON list of {name, cpu, memory, gpus, labels}")
    args = parser.parse_args()
    cluster = Cluster(args.root, json.loads(args.nodes) if args.nodes else DEFAULT_NODES)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(cluster, args.token))
    server.daemon_threads = True
    stop = threading.Event()

    def controllers() -> None:
        while not stop.is_set():
            cluster.tick()
            stop.wait(0.1)

    threading.Thread(target=controllers, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: (stop.set(), cluster.shutdown(), os._exit(0)))
    server.serve_forever()


if __name__ == "__main__":
    main()
