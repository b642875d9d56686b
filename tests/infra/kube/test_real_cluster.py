"""The Kubernetes backend against a REAL cluster: runs when KUBECONFIG names a kubeconfig (its current
context, namespace `CORRAL_TEST_KUBE_NAMESPACE` or the context's), skipped otherwise. It probes, runs a
CPU task to its end, reads its log and cleans up. Nothing here depends on the fake API server."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from corral.config import KubeEntry
from corral.infra.base import JobRequest, JobState, new_token
from corral.infra.kube.cluster import KubeInfra

KUBECONFIG = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
pytestmark = pytest.mark.skipif(not KUBECONFIG or not Path(KUBECONFIG).is_file(),
                                reason="no real cluster: KUBECONFIG does not name a kubeconfig")


def backend() -> KubeInfra:
    from kubernetes import config

    _, current = config.list_kube_config_contexts(config_file=KUBECONFIG)
    entry = KubeEntry(current["name"], KUBECONFIG, os.environ.get("CORRAL_TEST_KUBE_NAMESPACE"))
    return KubeInfra(entry, Counter(), timeout=10)


def test_a_task_runs_to_its_end_on_a_real_cluster():
    infra = backend()
    snapshot = asyncio.run(infra.probe())
    assert snapshot.nodes and snapshot.kind == "k8s"
    asked = JobRequest(token=new_token(), task_ids=("c-realcluster1",), place=snapshot.partitions[0].name,
                       num_nodes=1, accelerator_type=None, accelerators_per_node=0, cpus_per_node=None,
                       memory_mb=None, envs={"GREETING": "hello real cluster"}, setup=None,
                       run='echo "$GREETING rank=$CORRAL_NODE_RANK"')
    submitted = asyncio.run(infra.submit(asked))
    assert submitted.accepted, submitted.message
    try:
        deadline = time.monotonic() + 300  # an image pull can take minutes
        while True:
            found = [s for s in asyncio.run(infra.status([submitted.handle])) if s.handle == submitted.handle]
            if found and found[0].state in (JobState.SUCCEEDED, JobState.FAILED):
                break
            assert time.monotonic() < deadline, found
            time.sleep(2)
        assert found[0].state is JobState.SUCCEEDED, found[0]
        out: list[bytes] = []
        asyncio.run(infra.logs(submitted.handle, "", False, out.append))
        assert b"".join(out).decode() == "hello real cluster rank=0\n"
    finally:
        asyncio.run(infra.cancel([submitted.handle], [""]))
