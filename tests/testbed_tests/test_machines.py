"""The testbed's plain SSH machines (for `ssh/<pool>`): each its own host on the network, with its own
sshd, name and stand-in nvidia-smi; one can be taken away and brought back."""

from __future__ import annotations

import subprocess

from testbed.processes import read_pid
from tests.conftest import wait_for


def on(machines, name: str, command: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(machines.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                           name, command], capture_output=True, text=True, timeout=timeout)


def test_each_machine_is_its_own_host(machines):
    seen = {}
    for spec in machines.machines:
        answer = on(machines, spec.name, "hostname; ip -4 -o addr show dev eth0 | awk '{print $4}'")
        assert answer.returncode == 0, answer.stderr
        hostname, address = answer.stdout.split()
        assert hostname == spec.name and address == f"{spec.address}/24"
        seen[spec.name] = address
    assert len(set(seen.values())) == len(seen)
    # Machines reach each other (what a multi-node task's ranks need), by address.
    reach = on(machines, "lab1", "exec 3<>/dev/tcp/10.201.0.12/22 && head -c 4 <&3")
    assert reach.returncode == 0 and reach.stdout == "SSH-"


def test_the_stand_in_nvidia_smi_reports_each_machines_gpus(machines):
    query = "nvidia-smi --query-gpu=index,name,memory.total,uuid --format=csv,noheader,nounits"
    lab1 = on(machines, "lab1", query).stdout.splitlines()
    assert len(lab1) == 4 and lab1[0].startswith("0, NVIDIA A100-SXM4-80GB, 81920, GPU-lab1-0000")
    assert on(machines, "lab3", query).stdout.splitlines() == [
        "0, NVIDIA L4, 23034, GPU-lab3-0000-corral-testbed", "1, NVIDIA L4, 23034, GPU-lab3-0001-corral-testbed"]
    assert on(machines, "lab3", "bash -lc 'nvidia-smi -L'").stdout.startswith("GPU 0: NVIDIA L4 (UUID: ")
    header = on(machines, "lab1", "nvidia-smi --query-gpu=index,memory.total --format=csv").stdout.splitlines()
    assert header[:2] == ["index, memory.total", "0, 81920 MiB"]
    bad = on(machines, "lab1", "nvidia-smi --query-gpu=bogus --format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stderr
    assert on(machines, "lab4", "command -v nvidia-smi || echo none").stdout.strip() == "none"


def test_a_machine_that_goes_away_takes_its_processes_with_it(machines):
    started = on(machines, "lab2", "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!")
    pid = int(started.stdout.strip())
    assert subprocess.run(["kill", "-0", str(pid)]).returncode == 0
    sshd = read_pid(machines.paths("lab2").sshd_pidfile)
    machines.stop_machine("lab2")
    try:
        wait_for("the detached task to die with its machine",
                 lambda: subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0, timeout=10)
        gone = on(machines, "lab2", "true", timeout=30)
        assert gone.returncode == 255  # no route to it, as to a machine that crashed
    finally:
        machines.start_machine("lab2")
    assert read_pid(machines.paths("lab2").sshd_pidfile) != sshd
    assert on(machines, "lab2", "hostname").stdout.strip() == "lab2"


def test_machines_up_is_idempotent(machines):
    before = {m.name: read_pid(machines.paths(m.name).sshd_pidfile) for m in machines.machines}
    machines.up()
    assert {m.name: read_pid(machines.paths(m.name).sshd_pidfile) for m in machines.machines} == before


def test_one_round_trip_inventories_each_machine(machines):
    """Corral's inventory script (the ssh/<pool> backend's probe of one machine) against the real sshds."""
    from corral.infra.sshpool.inventory import inventory_script, parse_inventory

    for spec in machines.machines:
        answer = subprocess.run(["ssh", "-F", str(machines.ssh_config), spec.name, "bash", "-s"],
                                input=inventory_script(), capture_output=True, text=True, timeout=20)
        inventory = parse_inventory(spec.name, answer.stdout)
        assert inventory.host == spec.name and inventory.cpus >= 1 and inventory.memory_mb > 0
        assert [(g.name, g.memory_mib) for g in inventory.gpus] == [(g.name, g.memory_mib) for g in spec.gpus]
        assert inventory.gpu_source == ("nvidia-smi" if spec.nvidia_smi else "none")
