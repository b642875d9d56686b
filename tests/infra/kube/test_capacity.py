"""A context's capacity from its node and pod lists (recorded shapes: tests/fixtures/kube/)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from corral.infra.kube.capacity import node_gpus, quantity, snapshot

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kube"


def items(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())["items"]


@pytest.mark.parametrize("text, value", [("4", 4), ("7910m", Decimal("7.91")), ("16Gi", 16 * 2**30),
                                         ("1045020668Ki", 1045020668 * 1024), ("1.5G", Decimal("1.5e9")),
                                         ("129e6", Decimal("129e6")), ("512Mi", 512 * 2**20)])
def test_quantities(text, value):
    assert quantity(text) == value


@pytest.mark.parametrize("text", ["", "lots", "4 Gi", "1Qi", "--1"])
def test_a_bad_quantity_says_so(text):
    with pytest.raises(ValueError, match="not a resource quantity"):
        quantity(text)


def test_free_is_allocatable_minus_the_requests_of_pods_that_have_not_ended():
    snap = snapshot("prod", items("nodes.json"), items("pods.json"))
    nodes = {n.name: n for n in snap.nodes}
    a100 = nodes["gpu-a100-0"]
    assert (a100.usable, a100.cpus_total, a100.memory_mb) == (True, 95, 1045020668 // 1024)
    # 4 GPUs of the running pod (the Succeeded one's 4 are free again); CPUs: its init container's 8
    # outweigh its containers' 4.5; memory: 32Gi + 512Mi.
    assert [(p.gres_type, p.total, p.used) for p in a100.gpus] == [("NVIDIA-A100-SXM4-80GB", 8, 4)]
    assert (a100.cpus_alloc, a100.memory_alloc_mb) == (8, 32 * 1024 + 512)
    l4 = nodes["gke-pool-l4-1"]
    assert [(p.gres_type, p.total, p.used) for p in l4.gpus] == [("nvidia-l4", 2, 1)]  # limits stand for requests
    assert l4.cpus_total == 7
    assert (nodes["cpu-0"].usable, nodes["cpu-0"].reason, nodes["cpu-0"].gpus) == (False, "cordoned (unschedulable)", ())
    lost = nodes["gpu-a100-1"]
    assert (lost.usable, lost.reason, lost.gpus_free("NVIDIA-A100-SXM4-80GB")) == (
        False, "Kubelet stopped posting node status.", 0)
    assert [(d.partitions, d.gres_type, d.gpus) for d in snap.pending] == [(("prod",), "NVIDIA-A100-SXM4-80GB", 8)]
    assert [(p.name, p.total_nodes) for p in snap.partitions] == [("prod", 4)]
    assert (snap.kind, snap.container_runtimes) == ("k8s", ("kubernetes",))


def test_the_gpu_type_comes_from_the_first_label_present_and_the_resource_from_allocatable():
    node = {"metadata": {"name": "x", "labels": {"skypilot.co/accelerator": "h100",
                                                  "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"allocatable": {"amd.com/gpu": "0", "nvidia.com/gpu": "8"}}}
    found = node_gpus(node)
    assert (found.label, found.value, found.resource) == ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3",
                                                          "nvidia.com/gpu")
    amd = {"metadata": {"name": "y", "labels": {}}, "status": {"allocatable": {"amd.com/gpu": "4"}}}
    assert (node_gpus(amd).resource, node_gpus(amd).value) == ("amd.com/gpu", "")
    assert node_gpus({"metadata": {"name": "z"}, "status": {"allocatable": {"cpu": "4"}}}) is None
