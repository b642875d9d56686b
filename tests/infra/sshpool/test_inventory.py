"""One SSH machine's inventory, parsed from output recorded on the testbed's machines (lab1: four
stand-in A100s; lab3: two L4s, one held by a live task and one by a dead one; lab4: no nvidia-smi)."""

from __future__ import annotations

import pytest

from corral.errors import ProbeParseError
from corral.infra.sshpool.inventory import Gpu, inventory_script, parse_inventory
from tests.conftest import FIXTURES


def recorded(name: str) -> str:
    return (FIXTURES / "sshpool" / f"{name}.txt").read_text()


def test_gpus_cpus_and_memory_from_one_round_trip():
    lab1 = parse_inventory("lab1", recorded("lab1-inventory"))
    assert lab1.host == "lab1" and lab1.cpus == 2 and lab1.memory_mb == 24684084 // 1024
    assert [(g.index, g.name, g.memory_mib) for g in lab1.gpus] == [(i, "NVIDIA A100-SXM4-80GB", 81920) for i in range(4)]
    assert lab1.gpus[0].uuid == "GPU-lab1-0000-corral-testbed" and lab1.gpu_source == "nvidia-smi"
    assert lab1.held == {} and len(lab1.free_gpus) == 4
    assert lab1.address == "10.201.0.11"  # how a multi-node task's other ranks reach it
    assert lab1.runtimes == ("apptainer",) and lab1.home  # what runs an image there; its home's id
    assert parse_inventory("lab4", recorded("lab4-no-nvidia-smi")).runtimes == ()  # recorded before they were asked


def test_a_gpu_is_held_only_while_its_task_lives():
    lab3 = parse_inventory("lab3", recorded("lab3-held-inventory"))
    assert lab3.held == {1: "abcdef012345"}  # GPU 0's holder (pid 999999) is gone: free again
    assert [g.index for g in lab3.free_gpus] == [0]


def test_a_machine_without_nvidia_smi_takes_its_gpus_from_the_pools_config():
    assert parse_inventory("lab4", recorded("lab4-no-nvidia-smi")).gpus == ()
    configured = (Gpu(0, "A10G", None, None),)
    lab4 = parse_inventory("lab4", recorded("lab4-no-nvidia-smi"), configured)
    assert lab4.gpus == configured and lab4.gpu_source == "config"


def test_a_failing_nvidia_smi_is_a_warning_not_a_failure():
    # Not producible on demand on the testbed (its stand-in does not hang): the error path, written out.
    text = ("@@corral host 0\nlab1\n@@corral cpus 0\n2\n@@corral memory 0\n2048\n1024\n@@corral gpus 124\n"
            "@@corral held 0\n@@corral end 0\n")
    inventory = parse_inventory("lab1", text, (Gpu(0, "A100", None, None),))
    assert inventory.gpus == (Gpu(0, "A100", None, None),) and inventory.memory_available_mb == 1
    assert inventory.warnings == ("lab1: nvidia-smi timed out; using the pool's config for its GPUs",)


def test_an_incomplete_answer_is_an_error_naming_the_machine():
    with pytest.raises(ProbeParseError, match="lab1"):
        parse_inventory("lab1", recorded("lab1-inventory").split("@@corral held")[0])


def test_the_script_asks_nvidia_smi_with_a_bound():
    script = inventory_script()
    assert "timeout 10 nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits" in script
    assert 'base="$HOME/.corral/pool/$(hostname)"' in script and '"$base/held/"*' in script
