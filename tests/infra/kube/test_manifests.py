"""What Corral creates for one attempt: the Indexed Job (golden), its Service and ConfigMap, and
pod_config merged as SkyPilot merges it."""

from __future__ import annotations

import base64
import io
import json
import tarfile

import pytest

from corral.infra.base import JobRequest
from corral.infra.kube.cluster import _archives
from corral.infra.kube.manifests import (
    CONFIGMAP_LIMIT,
    config_map,
    env_secret,
    job,
    merge_pod_config,
    object_name,
    service,
    token_of,
)
from tests.infra.slurm.test_jobscript import check_golden


def request(**overrides) -> JobRequest:
    base = dict(token="0123456789ab", task_ids=("c-deadbeef",), place="prod", num_nodes=2,
                accelerator_type="NVIDIA-A100-SXM4-80GB", accelerators_per_node=4, cpus_per_node=16,
                memory_mb=65536, envs={"LR": "0.001"}, setup="pip list", run="python train.py",
                extra_env={"CORRAL_MANAGED_JOB": "c-deadbeef"}, checkpoint_dir="@default")
    base.update(overrides)
    return JobRequest(**base)


def test_the_indexed_job():
    manifest = job(request(), "prod", "nvidia.com/gpu.product", "nvidia.com/gpu")
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    check_golden("kube-pod.sh", container["command"][2])
    shown = json.loads(json.dumps(manifest))
    shown["spec"]["template"]["spec"]["containers"][0]["command"][2] = "<kube-pod.sh>"
    check_golden("kube-job.json", json.dumps(shown, indent=1, sort_keys=True) + "\n")
    spec = manifest["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed", 2, 2, 0)
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "16", "memory": "65536Mi", "nvidia.com/gpu": "4"},
                                                 "limits": {"nvidia.com/gpu": "4"}}
    assert pod["subdomain"] == manifest["metadata"]["name"] == "corral-0123456789ab"


def test_a_cpu_task_asks_for_no_gpu_and_selects_no_node():
    pod = job(request(accelerator_type=None, accelerators_per_node=0, cpus_per_node=None, memory_mb=None,
                      container_image="nvcr.io/nvidia/pytorch:24.01-py3"), "prod", "l", "nvidia.com/gpu")
    container = pod["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {}} and "nodeSelector" not in pod["spec"]["template"]["spec"]
    assert container["image"] == "nvcr.io/nvidia/pytorch:24.01-py3"


def test_service_and_config_map_carry_the_token():
    svc = service(request())
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == {"corral.dev/token": "0123456789ab"}
    cm = config_map(request(), {"run.sh": "x"}, {"home.tar.gz": "AAA="})
    assert cm["metadata"]["labels"]["corral.dev/token"] == "0123456789ab" and cm["binaryData"] == {"home.tar.gz": "AAA="}


def test_the_env_values_go_in_a_secret_the_pod_mounts_apart_from_the_config_map():
    secret = env_secret(request(), "export LR=0.001\n")
    assert (secret["kind"], secret["type"], secret["metadata"]["name"]) == ("Secret", "Opaque", "corral-0123456789ab")
    assert secret["stringData"] == {"env.sh": "export LR=0.001\n"}
    assert secret["metadata"]["labels"]["corral.dev/token"] == "0123456789ab"
    pod = job(request(), "prod", "l", "nvidia.com/gpu")["spec"]["template"]["spec"]
    assert {"name": "corral-env", "secret": {"secretName": "corral-0123456789ab"}} in pod["volumes"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts == {"corral-job": "/corral/job", "corral-env": "/corral/env"}
    script = pod["containers"][0]["command"][2]
    assert "/corral/env/env.sh" in script and "/corral/job/env.sh" not in script


def test_names():
    assert object_name("0123456789ab.3") == "corral-0123456789ab-3"  # a DNS label: pod hostnames stay valid
    assert token_of("corral-0123456789ab") == "0123456789ab" and token_of("other") is None
    with pytest.raises(ValueError):
        object_name("x; rm -rf /")


def test_a_walltime_is_the_pod_s_active_deadline_which_pod_config_may_set_itself():
    timed = job(request(time_limit_seconds=5400), "prod", "l", "nvidia.com/gpu")
    assert timed["spec"]["template"]["spec"]["activeDeadlineSeconds"] == 5400
    assert "activeDeadlineSeconds" not in timed["spec"]  # the Job's would count its time pending too
    assert "activeDeadlineSeconds" not in job(request(), "prod", "l", "nvidia.com/gpu")["spec"]["template"]["spec"]
    own = job(request(time_limit_seconds=60, scheduler_options={"pod_config": {"spec": {"activeDeadlineSeconds": 99}}}),
              "prod", "l", "nvidia.com/gpu")
    assert own["spec"]["template"]["spec"]["activeDeadlineSeconds"] == 99


def test_pod_config_merges_onto_corral_s_pod():
    pod = job(request(), "prod", "nvidia.com/gpu.product", "nvidia.com/gpu")["spec"]["template"]
    merged = merge_pod_config(pod, {
        "metadata": {"labels": {"team": "vision"}},
        "spec": {"containers": [{"env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                                 "volumeMounts": [{"name": "datasets", "mountPath": "/datasets"}]},
                                {"name": "sidecar", "image": "busybox"}],
                 "volumes": [{"name": "datasets", "nfs": {"server": "nfs.example", "path": "/export/datasets"}}],
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
        "status": {"ignored": True},
    })
    spec = merged["spec"]
    assert merged["metadata"]["labels"]["team"] == "vision"
    assert merged["metadata"]["labels"]["corral.dev/token"] == "0123456789ab"
    assert spec["containers"][0]["name"] == "task" and spec["containers"][0]["env"] == [
        {"name": "NCCL_DEBUG", "value": "INFO"}]
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["corral-job", "corral-env", "datasets"]
    assert [c["name"] for c in spec["containers"]] == ["task", "sidecar"]
    assert [v["name"] for v in spec["volumes"]] == ["corral-job", "corral-env", "datasets"]
    assert [t["key"] for t in spec["tolerations"]] == ["nvidia.com/gpu", "nvidia.com/gpu"] and "status" not in merged
    assert "datasets" not in json.dumps(pod)  # the original is left alone


def test_uploads_pack_under_the_home_and_at_the_root(tmp_path):
    workdir = tmp_path / "w"
    (workdir / "src").mkdir(parents=True)
    (workdir / "src" / "train.py").write_text("print(1)\n")
    data = tmp_path / "data.csv"
    data.write_text("a,b\n")
    archives = _archives([(workdir, ".corral/runs/0123456789ab/workdir/"), (data, "/datasets/small.csv"),
                          (data, "inputs/")], CONFIGMAP_LIMIT)

    def names(key: str) -> list[str]:
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(archives[key]))) as tar:
            return sorted(tar.getnames())

    assert names("home.tar.gz") == [".corral/runs/0123456789ab/workdir/src",
                                    ".corral/runs/0123456789ab/workdir/src/train.py", "inputs/data.csv"]
    assert names("root.tar.gz") == ["datasets/small.csv"]
