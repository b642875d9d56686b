"""Plain GPU machines reached over SSH (the `ssh/<pool>` backend's testbed): each in its own network
namespace with its own address, running its own sshd, with a STAND-IN `nvidia-smi` that reports the
GPUs its spec gives it. No GPU exists here; the stand-in is what a probe can observe of one.

The machines share this host's filesystem (homes included) and its CPUs and memory: `nproc` and
/proc/meminfo show the host's, as they would on a VM without limits. What differs per machine is its
name (`hostname`, its own UTS namespace), its address (10.201.0.x on the bridge `corralbr0`, reachable
from the host and from each other), its host key and its GPUs. `stop_machine` takes one away as a
crashed box goes away: every process in its namespace killed, its link cut.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from testbed.layout import sshd_access
from testbed.processes import TestbedError, kill_tree, port_open, run, running, spawn, wait_until
from testbed.spec import TEST_USER
from testbed.standins import RUNTIME_STANDIN

BRIDGE = "corralbr0"
HOST_ADDRESS = "10.201.0.1"
PREFIX = 24


@dataclass(frozen=True)
class GpuSpec:
    name: str  # as nvidia-smi names it
    memory_mib: int


@dataclass(frozen=True)
class MachineSpec:
    name: str
    address: str
    gpus: tuple[GpuSpec, ...] = ()
    nvidia_smi: bool = True  # False: a machine without the driver's tools (its GPUs come from config)
    runtimes: tuple[str, ...] = ("apptainer",)  # container runtimes on its PATH (stand-ins: standins.py)

    @property
    def namespace(self) -> str:
        return f"corral-{self.name}"

    @property
    def host_link(self) -> str:
        return f"cv-{self.name}"[:15]


A100 = GpuSpec("NVIDIA A100-SXM4-80GB", 81920)
L4 = GpuSpec("NVIDIA L4", 23034)


def default_machines() -> tuple[MachineSpec, ...]:
    return (
        MachineSpec("lab1", "10.201.0.11", (A100,) * 4),
        MachineSpec("lab2", "10.201.0.12", (A100,) * 4),
        MachineSpec("lab3", "10.201.0.13", (L4,) * 2),
        MachineSpec("lab4", "10.201.0.14", (), nvidia_smi=False),
    )


# nvidia-smi as Corral's probe asks it: --query-gpu=… --format=csv[,noheader][,nounits], -L, and
# --query-compute-apps (nothing runs on a stand-in GPU). Unknown fields fail as nvidia-smi's do.
NVIDIA_SMI = r"""#!/bin/bash
# Written by the Corral testbed: a STAND-IN for nvidia-smi on {machine}. No GPU exists; it reports these.
gpus=(
{gpus}
)
query= format= apps=
for arg in "$@"; do
  case "$arg" in
    --query-gpu=*) query="${{arg#--query-gpu=}}" ;;
    --query-compute-apps=*) apps=1 ;;
    --format=*) format="${{arg#--format=}}" ;;
    -L|--list-gpus)
      for i in "${{!gpus[@]}}"; do
        IFS='|' read -r name memory uuid <<< "${{gpus[$i]}}"
        echo "GPU $i: $name (UUID: $uuid)"
      done
      exit 0 ;;
  esac
done
[ -n "$apps" ] && exit 0
if [ -z "$query" ]; then
  echo "NVIDIA-SMI (Corral testbed stand-in) on {machine}: ${{#gpus[@]}} GPU(s)"
  for i in "${{!gpus[@]}}"; do IFS='|' read -r name memory uuid <<< "${{gpus[$i]}}"; echo "  $i  $name  ${{memory}}MiB"; done
  exit 0
fi
units=MiB pct=" %"
case ",$format," in *,nounits,*) units= pct= ;; esac
header=1
case ",$format," in *,noheader,*) header= ;; esac
IFS=',' read -r -a fields <<< "$query"
for field in "${{fields[@]}}"; do
  case "$field" in
    index|name|uuid|memory.total|memory.used|memory.free|utilization.gpu|pci.bus_id|count) ;;
    *) echo "Field \"$field\" is not a valid field to query." >&2; exit 2 ;;
  esac
done
if [ -n "$header" ]; then
  (IFS=','; echo "${{fields[*]}}" | sed 's/,/, /g')
fi
for i in "${{!gpus[@]}}"; do
  IFS='|' read -r name memory uuid <<< "${{gpus[$i]}}"
  out=()
  for field in "${{fields[@]}}"; do
    case "$field" in
      index) out+=("$i") ;;
      name) out+=("$name") ;;
      uuid) out+=("$uuid") ;;
      memory.total) out+=("$memory${{units:+ $units}}") ;;
      memory.used) out+=("0${{units:+ $units}}") ;;
      memory.free) out+=("$memory${{units:+ $units}}") ;;
      utilization.gpu) out+=("0$pct") ;;
      pci.bus_id) out+=("00000000:$(printf '%02X' $((i + 1))):00.0") ;;
      count) out+=("${{#gpus[@]}}") ;;
    esac
  done
  (IFS=','; echo "${{out[*]}}" | sed 's/,/, /g')
done
"""


@dataclass(frozen=True)
class MachinePaths:
    root: Path  # <testbed>/machines/<name>

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def sshd_config(self) -> Path:
        return self.root / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def sshd_pidfile(self) -> Path:
        return self.root / "sshd.pid"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"


class Machines:
    """The SSH machines: their namespaces, sshds and stand-ins; `up` is idempotent."""

    def __init__(self, root: Path, authorized_keys: Path, client_key: Path,
                 machines: tuple[MachineSpec, ...] | None = None):
        self.root = root / "machines"
        self.authorized_keys = authorized_keys
        self.client_key = client_key
        self.machines = machines or default_machines()

    def paths(self, name: str) -> MachinePaths:
        return MachinePaths(self.root / name)

    def spec(self, name: str) -> MachineSpec:
        for machine in self.machines:
            if machine.name == name:
                return machine
        raise TestbedError(f"no testbed machine {name!r} (known: {', '.join(m.name for m in self.machines)})")

    @property
    def ssh_config(self) -> Path:
        """An OpenSSH config with one Host per machine, for `ssh -F` (tests, and pools' configs)."""
        return self.root / "ssh-config"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    # ---- whole set ----------------------------------------------------------------------------------
    def up(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self._ensure_bridge()
        for machine in self.machines:
            self._write_files(machine)
        self.known_hosts.write_text("".join(
            f"{m.address} {' '.join(Path(f'{self.paths(m.name).host_key}.pub').read_text().split()[:2])}\n"
            for m in self.machines))
        self.ssh_config.write_text(render_ssh_config(self.machines, self.client_key, self.known_hosts))
        for machine in self.machines:
            self.start_machine(machine.name)

    def down(self) -> None:
        for machine in self.machines:
            self.stop_machine(machine.name)
            run(["ip", "netns", "delete", machine.namespace], check=False)
        run(["ip", "link", "delete", BRIDGE], check=False)

    def status(self) -> dict[str, bool]:
        return {m.name: running(self.paths(m.name).sshd_pidfile) is not None and port_open(22, m.address)
                for m in self.machines}

    # ---- one machine --------------------------------------------------------------------------------
    def start_machine(self, name: str) -> None:
        machine = self.spec(name)
        self._ensure_namespace(machine)
        paths = self.paths(name)
        if not running(paths.sshd_pidfile):
            run(["/usr/sbin/sshd", "-t", "-f", str(paths.sshd_config)])
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
            # In its namespace, with its own hostname; every exec keeps the pid, so it is sshd's.
            proc = spawn(["ip", "netns", "exec", machine.namespace, "unshare", "--uts", "sh", "-c",
                          'hostname "$1" && shift && exec "$@"', "sh", machine.name,
                          "/usr/sbin/sshd", "-D", "-e", "-f", str(paths.sshd_config)], paths.log)
            paths.sshd_pidfile.write_text(f"{proc.pid}\n")
        wait_until(f"{name}'s sshd on {machine.address}", lambda: port_open(22, machine.address), 30)

    def stop_machine(self, name: str) -> None:
        """The machine goes away: its sshd, and every process in its namespace (a task left running
        detached from its session included), killed; its link down until it starts again."""
        machine = self.spec(name)
        pid = running(self.paths(name).sshd_pidfile)
        if pid:
            kill_tree(pid, signal.SIGKILL)
        listed = run(["ip", "netns", "pids", machine.namespace], check=False).stdout.split()
        for victim in listed:
            try:
                os.kill(int(victim), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        run(["ip", "link", "set", machine.host_link, "down"], check=False)

    def unplug_machine(self, name: str) -> None:
        """The machine is cut off (its link down, as a network partition) and runs on: its sshd and its
        tasks go on, unreachable, until it is plugged in again."""
        run(["ip", "link", "set", self.spec(name).host_link, "down"])

    def plug_machine(self, name: str) -> None:
        run(["ip", "link", "set", self.spec(name).host_link, "up"])
        machine = self.spec(name)
        wait_until(f"{name}'s sshd on {machine.address}", lambda: port_open(22, machine.address), 30)

    # ---- internals ----------------------------------------------------------------------------------
    def _ensure_bridge(self) -> None:
        if run(["ip", "link", "show", BRIDGE], check=False).returncode != 0:
            run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        addresses = run(["ip", "-4", "-o", "addr", "show", "dev", BRIDGE]).stdout
        if f" {HOST_ADDRESS}/" not in addresses:
            run(["ip", "addr", "add", f"{HOST_ADDRESS}/{PREFIX}", "dev", BRIDGE])
        run(["ip", "link", "set", BRIDGE, "up"])

    def _ensure_namespace(self, machine: MachineSpec) -> None:
        namespaces = run(["ip", "netns", "list"]).stdout.split()
        if machine.namespace not in namespaces:
            run(["ip", "netns", "add", machine.namespace])
        inside = ["ip", "netns", "exec", machine.namespace]
        if run(["ip", "link", "show", machine.host_link], check=False).returncode != 0:
            run(["ip", "link", "add", machine.host_link, "type", "veth", "peer", "name", "eth0", "netns",
                 machine.namespace])
            run(["ip", "link", "set", machine.host_link, "master", BRIDGE])
            run([*inside, "ip", "addr", "add", f"{machine.address}/{PREFIX}", "dev", "eth0"])
        run(["ip", "link", "set", machine.host_link, "up"])
        run([*inside, "ip", "link", "set", "lo", "up"])
        run([*inside, "ip", "link", "set", "eth0", "up"])
        routes = run([*inside, "ip", "route", "show", "default"]).stdout
        if not routes.strip():
            run([*inside, "ip", "route", "add", "default", "via", HOST_ADDRESS])

    def _write_files(self, machine: MachineSpec) -> None:
        paths = self.paths(machine.name)
        paths.bin.mkdir(parents=True, exist_ok=True)
        paths.root.chmod(0o755)
        paths.bin.chmod(0o755)
        if not paths.host_key.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{machine.name}-machine", "-f",
                 str(paths.host_key)])
        smi = paths.bin / "nvidia-smi"
        if machine.nvidia_smi:
            gpus = "\n".join(f"  '{gpu.name}|{gpu.memory_mib}|GPU-{machine.name}-{i:04d}-corral-testbed'"
                             for i, gpu in enumerate(machine.gpus))
            smi.write_text(NVIDIA_SMI.format(machine=machine.name, gpus=gpus))
            smi.chmod(0o755)
        else:
            smi.unlink(missing_ok=True)
        for runtime in ("apptainer", "singularity"):
            standin = paths.bin / runtime
            if runtime in machine.runtimes:
                standin.write_text(RUNTIME_STANDIN.format(runtime=runtime))
                standin.chmod(0o755)
            else:
                standin.unlink(missing_ok=True)
        paths.sshd_config.write_text(render_sshd_config(machine, paths, self.authorized_keys))


def machine_path(paths: MachinePaths) -> str:
    return f"{paths.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def render_sshd_config(machine: MachineSpec, paths: MachinePaths, authorized_keys: Path) -> str:
    return "\n".join([
        f"# Written by the Corral testbed: the SSH machine {machine.name}.",
        "Port 22",
        f"ListenAddress {machine.address}",
        f"HostKey {paths.host_key}",
        f"PidFile {paths.root / 'sshd-own.pid'}",
        *sshd_access(authorized_keys),
        # Its PATH (with the stand-in nvidia-smi) for non-login shells; /etc/profile.d re-adds it in login ones.
        f"SetEnv CORRAL_TESTBED_MACHINE={machine.name} PATH={machine_path(paths)}",
        "Subsystem sftp internal-sftp",
        "",
    ])


def render_ssh_config(machines: tuple[MachineSpec, ...], client_key: Path, known_hosts: Path) -> str:
    out = ["# Written by the Corral testbed: one Host per SSH machine."]
    for machine in machines:
        out += [f"Host {machine.name}", f"    HostName {machine.address}", f"    User {TEST_USER}",
                f"    IdentityFile {client_key}", "    IdentitiesOnly yes", f"    UserKnownHostsFile {known_hosts}",
                "    StrictHostKeyChecking yes", ""]
    return "\n".join(out)
