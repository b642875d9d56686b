"""A Kubernetes context's capacity in the seam's terms (pure: parsed from the API's node and pod lists,
as `kubectl get nodes,pods -o json` prints them; unit-tested on recorded lists).

Free is what the scheduler sees: a node's allocatable minus the requests of the pods bound to it that
have not ended. A node's GPU type is its label (`GPU_LABELS`, the first one present: NVIDIA's GPU
feature discovery, GKE, EKS/Karpenter, CoreWeave, SkyPilot's own); its GPUs are the extended resource
(`GPU_RESOURCES`) in its allocatable. The context is one place (`partition`), named as the context.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from corral.infra.base import ClusterSnapshot, GpuPool, Node, Partition, PendingDemand

GPU_LABELS = (
    "nvidia.com/gpu.product",  # NVIDIA GPU feature discovery: NVIDIA-A100-SXM4-80GB
    "cloud.google.com/gke-accelerator",  # GKE: nvidia-tesla-a100, nvidia-l4
    "karpenter.k8s.aws/instance-gpu-name",  # EKS with Karpenter: a100
    "gpu.nvidia.com/class",  # CoreWeave: A100_NVLINK_80GB
    "skypilot.co/accelerator",  # clusters set up for SkyPilot: a100
)
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
DEFAULT_GPU_LABEL = GPU_LABELS[0]
DEFAULT_GPU_RESOURCE = GPU_RESOURCES[0]
ENDED_PHASES = frozenset({"Succeeded", "Failed"})

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)\Z")
_SUFFIX = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
           "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(text: object) -> Decimal:
    """A Kubernetes resource quantity ("7910m", "16Gi", "1.5G", "129e6", "4") as a number."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a resource quantity: {text!r}")
    try:
        return Decimal(match.group(1)) * Decimal(_SUFFIX[match.group(2)])
    except InvalidOperation:
        raise ValueError(f"not a resource quantity: {text!r}") from None


@dataclass(frozen=True)
class NodeGpus:
    """How a node's GPUs are asked for: the label that names their type, and the resource that counts them."""

    label: str
    value: str
    resource: str


def node_gpus(node: Mapping[str, Any]) -> NodeGpus | None:
    labels = node.get("metadata", {}).get("labels") or {}
    allocatable = node.get("status", {}).get("allocatable") or {}
    resource = next((r for r in GPU_RESOURCES if quantity(allocatable.get(r, 0)) > 0), None)
    if resource is None:
        return None
    label = next((key for key in GPU_LABELS if labels.get(key)), None)
    return NodeGpus(label or DEFAULT_GPU_LABEL, labels.get(label, "") if label else "", resource)


def _requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """A pod's effective requests: its containers' sum, or an init container's if larger (as the scheduler)."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in asked.items():
            total[name] = total.get(name, Decimal(0)) + quantity(value)
    for container in spec.get("initContainers") or []:
        resources = container.get("resources") or {}
        for name, value in {**(resources.get("limits") or {}), **(resources.get("requests") or {})}.items():
            total[name] = max(total.get(name, Decimal(0)), quantity(value))
    return total


def _ready(node: Mapping[str, Any]) -> tuple[bool, str | None]:
    if (node.get("spec") or {}).get("unschedulable"):
        return False, "cordoned (unschedulable)"
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return True, None
            return False, condition.get("message") or condition.get("reason") or "not Ready"
    return False, "no Ready condition"


def snapshot(context: str, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
             version: str | None = None, probe_seconds: float = 0.0) -> ClusterSnapshot:
    """The context's capacity from its nodes and the pods of every namespace (ended pods are skipped)."""
    used: dict[str, dict[str, Decimal]] = {}
    demand: list[PendingDemand] = []
    node_list = list(nodes)
    types = {n["metadata"]["name"]: node_gpus(n) for n in node_list}
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") in ENDED_PHASES:
            continue
        asked = _requests(pod)
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name:
            mine = used.setdefault(node_name, {})
            for name, value in asked.items():
                mine[name] = mine.get(name, Decimal(0)) + value
            continue
        gpus = sum(int(asked.get(r, 0)) for r in GPU_RESOURCES)
        if gpus:
            selector = (pod.get("spec") or {}).get("nodeSelector") or {}
            gpu_type = next((selector[key] for key in GPU_LABELS if key in selector), None)
            demand.append(PendingDemand((context,), gpu_type, gpus))
    out = []
    for node in node_list:
        name = node["metadata"]["name"]
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        mine = used.get(name, {})
        usable, reason = _ready(node)
        cpus = quantity(allocatable.get("cpu", 0))
        memory = quantity(allocatable.get("memory", 0))
        gpu = types[name]
        pools: tuple[GpuPool, ...] = ()
        if gpu is not None:
            pools = (GpuPool(gpu.value or None, int(quantity(allocatable[gpu.resource])),
                             int(mine.get(gpu.resource, 0))),)
        state = "notready" if not usable else ("mixed" if mine else "idle")
        out.append(Node(name, (context,), state, usable, math.floor(cpus), min(math.floor(cpus),
                        math.ceil(mine.get("cpu", 0))), int(memory // 2**20),
                        int(mine.get("memory", 0) // 2**20), pools, reason))
    partition = Partition(context, True, "UP", "UNLIMITED", None, len(out))
    return ClusterSnapshot(context, version, tuple(out), (partition,), tuple(demand), ("kubernetes",), kind="k8s",
                           probe_seconds=probe_seconds)
