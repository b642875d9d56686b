"""What Corral creates in a namespace for one attempt (pure: dicts the API takes as they are).

- a ConfigMap `corral-<token>`: the task's `setup.sh`, `run.sh` and, as tar.gz, its workdir and file
  mounts (`home.tar.gz`, unpacked in the container's home; `root.tar.gz`, at `/`), mounted at
  `JOB_FILES`. A ConfigMap holds at most 1 MiB: a larger workdir belongs on a volume (`pod_config`).
- a Secret `corral-<token>`: `env.sh`, the task's envs and secrets, mounted at `ENV_FILES`. Apart from
  the ConfigMap, so that a role that may read ConfigMaps but not Secrets (Kubernetes' own `view`) does
  not see them, and so that the run files' pass (run_files.py) can delete it once the job has ended.
- an Indexed Job `corral-<token>`: one pod per node, `completions = parallelism = num_nodes`,
  `backoffLimit: 0` (Corral, not Kubernetes, decides what to retry). Pod i's hostname is
  `corral-<token>-<i>` under the Service, so the nodes reach each other by name.
- a headless Service `corral-<token>` for that rendezvous.

The Service, the ConfigMap and the Secret are owned by the Job (`ownerReferences`), so they go when it goes.

Every object carries `LABEL_TOKEN` (the attempt's token, so a retried submission finds its job) and
`LABEL_MANAGED`. The task's `config.kubernetes.pod_config` is merged onto the pod as SkyPilot does:
maps key by key, the first container onto Corral's, other lists appended.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Mapping
from typing import Any

from corral.infra.base import JobRequest
from corral.infra.shell import check_token, checkpoint_lines

LABEL_TOKEN = "corral.dev/token"
LABEL_JOB_ID = "corral.dev/job-id"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
JOB_FILES = "/corral/job"
ENV_FILES = "/corral/env"
DEFAULT_IMAGE = "docker.io/library/ubuntu:24.04"
CONFIGMAP_LIMIT = 1_000_000  # bytes: the API server refuses a larger object (1 MiB, with its metadata)
FINISHED_TTL_SECONDS = 3 * 24 * 3600


def object_name(token: str) -> str:
    """`corral-<token>`: a DNS label, so that pod hostnames (`<name>-<index>`) are valid too."""
    return "corral-" + check_token(token).replace(".", "-")


def token_of(name: str) -> str | None:
    return name.removeprefix("corral-") if name.startswith("corral-") else None


def pod_script(request: JobRequest, context: str) -> str:
    """The container's command: unpack the files, Corral's variables, setup then run with the task's env."""
    token = request.token
    variables = {
        "CORRAL_TASK_ID": request.task_ids[0], "SKYPILOT_TASK_ID": request.task_ids[0], "CORRAL_CLUSTER": context,
        "CORRAL_JOB_RANK": str(request.first_rank), "CORRAL_NUM_JOBS": str(request.num_jobs),
        "CORRAL_NUM_NODES": str(request.num_nodes), "SKYPILOT_NUM_NODES": str(request.num_nodes),
        "CORRAL_NUM_GPUS_PER_NODE": str(request.accelerators_per_node),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(request.accelerators_per_node), **request.extra_env,
    }
    name = object_name(token)
    hosts = "\n".join(f"{name}-{i}.{name}" for i in range(request.num_nodes))
    lines = [
        "# Written by Corral: the task in this pod (node JOB_COMPLETION_INDEX of the Indexed Job).",
        "set -u",
        f'export CORRAL_RUN_DIR="$HOME"/.corral/runs/{shlex.quote(token)}',
        'mkdir -p "$CORRAL_RUN_DIR/workdir" || exit 1',
        f'if [ -s {JOB_FILES}/home.tar.gz ]; then tar -xzf {JOB_FILES}/home.tar.gz -C "$HOME" || exit 1; fi',
        f"if [ -s {JOB_FILES}/root.tar.gz ]; then tar -xzf {JOB_FILES}/root.tar.gz -C / || exit 1; fi",
        'rank="${JOB_COMPLETION_INDEX:-0}"',
        'export CORRAL_NODE_RANK="$rank" SKYPILOT_NODE_RANK="$rank"',
        f"export CORRAL_NODE_IPS={shlex.quote(hosts)} SKYPILOT_NODE_IPS={shlex.quote(hosts)}",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(variables.items())]
    if request.checkpoint_dir:
        lines += checkpoint_lines(request.checkpoint_dir, shlex.quote(request.task_ids[0]))
    lines += [
        'cd "$CORRAL_RUN_DIR/workdir" || exit 1',
        f'with_env() {{ "$BASH" -c \'. "$1" || exit 1; shift; exec "$BASH" "$@"\' task-env {ENV_FILES}/env.sh "$@"; }}',
        f"if [ -s {JOB_FILES}/setup.sh ]; then",
        f"  with_env {JOB_FILES}/setup.sh; rc=$?",
        '  if [ "$rc" -ne 0 ]; then echo "corral: setup failed on $(hostname) with exit code $rc" >&2; exit "$rc"; fi',
        "fi",
        f"[ -s {JOB_FILES}/run.sh ] || exit 0",
        f"with_env {JOB_FILES}/run.sh",
    ]
    return "\n".join(lines) + "\n"


def labels(request: JobRequest) -> dict[str, str]:
    return {LABEL_TOKEN: request.token, LABEL_JOB_ID: request.task_ids[0],
            LABEL_MANAGED: "corral"}


def config_map(request: JobRequest, files: Mapping[str, str], archives: Mapping[str, str]) -> dict[str, Any]:
    """`files`: text by name; `archives`: base64 tar.gz by name."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": object_name(request.token), "labels": labels(request)},
            "data": dict(files), "binaryData": dict(archives)}


def env_secret(request: JobRequest, env_text: str) -> dict[str, Any]:
    """The attempt's `env.sh` (its env values, secrets included) as a Secret; the API stores
    `stringData` base64-encoded under `data`."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": object_name(request.token), "labels": labels(request)},
            "stringData": {"env.sh": env_text}}


def owned_by(job_object: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata making an object the Job's (garbage-collected with it); {} without the Job's uid."""
    meta = job_object.get("metadata") or {}
    if not meta.get("uid"):
        return {}
    return {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta.get("name"),
                                 "uid": meta["uid"], "blockOwnerDeletion": False}]}


def service(request: JobRequest, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    name = object_name(request.token)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": labels(request), **(owner or {})},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {LABEL_TOKEN: labels(request)[LABEL_TOKEN]}}}


def job(request: JobRequest, context: str, gpu_label: str, gpu_resource: str) -> dict[str, Any]:
    """The Indexed Job. `gpu_label`/`gpu_resource`: how this context's nodes name and count the GPU type."""
    name = object_name(request.token)
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if request.cpus_per_node:
        requests["cpu"] = str(request.cpus_per_node)
    if request.memory_mb:
        requests["memory"] = f"{request.memory_mb}Mi"
    if request.accelerators_per_node:
        requests[gpu_resource] = limits[gpu_resource] = str(request.accelerators_per_node)
    container: dict[str, Any] = {
        "name": "task", "image": request.container_image or DEFAULT_IMAGE,
        "command": ["/bin/bash", "-c", pod_script(request, context)],
        "resources": {"requests": requests, **({"limits": limits} if limits else {})},
        "volumeMounts": [{"name": "corral-job", "mountPath": JOB_FILES, "readOnly": True},
                         {"name": "corral-env", "mountPath": ENV_FILES, "readOnly": True}],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never", "subdomain": name, "containers": [container],
        "volumes": [{"name": "corral-job", "configMap": {"name": name}},
                    {"name": "corral-env", "secret": {"secretName": name}}],
    }
    if request.accelerators_per_node and request.accelerator_type:
        pod_spec["nodeSelector"] = {gpu_label: request.accelerator_type}
    if request.accelerators_per_node:  # GPU nodes are often tainted so that only GPU pods land there (GKE, EKS)
        pod_spec["tolerations"] = [{"key": gpu_resource, "operator": "Exists", "effect": "NoSchedule"}]
    if request.time_limit_seconds:  # counted from the pod's start on its node (the kubelet's), as Slurm's
        pod_spec["activeDeadlineSeconds"] = int(request.time_limit_seconds)
    pod = {"metadata": {"labels": labels(request)}, "spec": pod_spec}
    pod_config = (request.scheduler_options or {}).get("pod_config")
    if pod_config:
        pod = merge_pod_config(pod, pod_config)
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels(request)},
        "spec": {"completionMode": "Indexed", "completions": request.num_nodes, "parallelism": request.num_nodes,
                 "backoffLimit": 0, "ttlSecondsAfterFinished": FINISHED_TTL_SECONDS, "template": pod},
    }


def merge_pod_config(pod: Mapping[str, Any], pod_config: Mapping[str, Any]) -> dict[str, Any]:
    """`pod_config` (a Pod manifest's fields) onto Corral's pod: maps key by key; `spec.containers[0]`
    onto Corral's container (its `env`, `volumeMounts`, … appended); other lists appended."""
    merged = copy.deepcopy(dict(pod))
    _merge(merged, {k: v for k, v in pod_config.items() if k in ("metadata", "spec")})
    return merged


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        current = into.get(key)
        if key == "containers" and isinstance(current, list) and isinstance(value, list) and current and value:
            first = dict(current[0])
            if isinstance(value[0], Mapping):
                _merge(first, value[0])
            into[key] = [first, *current[1:], *copy.deepcopy(value[1:])]
        elif isinstance(current, dict) and isinstance(value, Mapping):
            _merge(current, value)
        elif isinstance(current, list) and isinstance(value, list):
            into[key] = current + copy.deepcopy(value)
        else:
            into[key] = copy.deepcopy(value)
