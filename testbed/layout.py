"""Where each cluster's files live under the testbed root, and their contents."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.spec import ALL_USERS, TEST_USER, ClusterSpec


@dataclass(frozen=True)
class ClusterPaths:
    root: Path

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def sshd_config(self) -> Path:
        return self.etc / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.etc / "ssh_host_ed25519_key"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def modules(self) -> Path:
        """The site's environment-modules tree (`module use` it, as its users' docs would say)."""
        return self.root / "modules"

    @property
    def runtime_bin(self) -> Path:
        """The site's container runtimes (stand-ins), first on its login shells' PATH (PROFILE_SCRIPT);
        jobs inherit it from the shell that submits them."""
        return self.root / "runtime-bin"

    @property
    def scratch(self) -> Path:
        """The site's scratch filesystem: world-writable with the sticky bit, as /scratch is."""
        return self.root / "scratch"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    def ctld_pidfile(self) -> Path:
        return self.run / "slurmctld.pid"

    def slurmd_pidfile(self, node: str) -> Path:
        return self.run / f"slurmd-{node}.pid"

    def sshd_pidfile(self) -> Path:
        return self.run / "sshd.pid"


@dataclass(frozen=True)
class TestbedPaths:
    root: Path

    def cluster(self, name: str) -> ClusterPaths:
        return ClusterPaths(self.root / name)

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def client_key(self) -> Path:
        return self.root / "client" / "id_ed25519"

    def user_key(self, user: str) -> Path:
        """A team member's own ssh key (TEAM_USERS); the test user's is `client_key`."""
        return self.client_key if user == TEST_USER else self.root / "client" / "keys" / user

    @property
    def authorized_keys(self) -> Path:
        """One file per user (sshd's AuthorizedKeysFile …/%u): each key opens only its own account."""
        return self.root / "client" / "authorized_keys.d"

    @property
    def known_hosts(self) -> Path:
        return self.root / "client" / "known_hosts"

    @property
    def cluster_config(self) -> Path:
        return self.root / "client" / "slurm-config"


def render_slurm_conf(spec: ClusterSpec, paths: ClusterPaths, max_job_count: int | None = None) -> str:
    lines = [
        "# Written by the Corral testbed; regenerated on every `testbed up`.",
        f"ClusterName={spec.name}",
        f"SlurmctldHost={spec.ctld_host}(127.0.0.1)",
        f"SlurmctldPort={spec.ctld_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={paths.munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={paths.state}",
        f"SlurmdSpoolDir={paths.spool}/%n",
        f"SlurmctldPidFile={paths.ctld_pidfile()}",
        f"SlurmdPidFile={paths.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={paths.log}/slurmctld.log",
        f"SlurmdLogFile={paths.log}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=5",
        "GresTypes=gpu",
        *accounting_lines(spec, paths),
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "MinJobAge=86400",
        "DefMemPerCPU=1000",
        "ReturnToService=2",
        "SlurmdTimeout=20",
        "SlurmctldTimeout=20",
        "MessageTimeout=5",
        "SlurmdParameters=config_overrides",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        *spec.extra_conf,
        *([f"MaxJobCount={max_job_count}"] if max_job_count else []),
    ]
    for node in spec.nodes:
        line = (
            f"NodeName={node.name} NodeHostname={node.name} NodeAddr=127.0.0.1 Port={node.port} "
            f"Sockets={node.sockets} CoresPerSocket={node.cores_per_socket} ThreadsPerCore=1 "
            f"RealMemory={node.memory_mb} State=UNKNOWN"
        )
        if node.gres:
            line += f" Gres={node.gres}"
        if node.features:
            line += f" Features={node.features}"
        lines.append(line)
    for part in spec.partitions:
        line = f"PartitionName={part.name} MaxTime={part.max_time} DefaultTime={part.default_time} State=UP"
        line += f" Nodes={','.join(part.nodes)}" if part.nodes else ""
        line += " Default=YES" if part.default else ""
        lines.append(line)
    return "\n".join(lines) + "\n"


def accounting_lines(spec: ClusterSpec, paths: ClusterPaths) -> list[str]:
    if not spec.accounting:
        # Without slurmdbd there is no sacct: finished jobs are only visible while MinJobAge lasts.
        return ["AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none"]
    gres_types = ",".join(["gres/gpu", *(f"gres/gpu:{t}" for t in spec.gpu_types)])
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={spec.dbd_port}",
        # For slurmdbd this names the munge socket to authenticate with, not a password.
        f"AccountingStoragePass={paths.munge_socket}",
        f"AccountingStorageTRES={gres_types}",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=30",
    ]


def render_gres_conf(spec: ClusterSpec, paths: ClusterPaths) -> str:
    lines = ["AutoDetect=off"]
    for node in spec.nodes:
        if not node.gpus:
            continue
        line = f"NodeName={node.name} Name=gpu"
        if node.gpu_type:
            line += f" Type={node.gpu_type}"
        line += f" File={paths.dev}/{node.name}/nvidia[0-{node.gpus - 1}]"
        if node.gpu_cores:
            line += f" Cores={node.gpu_cores}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def sshd_access(authorized_keys: Path) -> list[str]:
    """What every testbed sshd (a login node's, a pool machine's) allows: keys only, the testbed's
    users, forwarding, and sessions enough for Corral's ControlMasters and parallel tests.
    `authorized_keys`: the folder of per-user files (TestbedPaths.authorized_keys)."""
    return [
        # The testbed's own keys, then each account's own file (where a member authorizes the team
        # server's key for them, as on a real cluster).
        f"AuthorizedKeysFile {authorized_keys}/%u .ssh/authorized_keys",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        f"AllowUsers {' '.join(ALL_USERS)}",
        "AllowTcpForwarding yes",
        "PrintMotd no",
        "MaxSessions 64",
        "MaxStartups 64:30:128",
    ]


def render_sshd_config(spec: ClusterSpec, paths: ClusterPaths, authorized_keys: Path) -> str:
    return "\n".join([
        "# Written by the Corral testbed: this cluster's login node.",
        f"Port {spec.ssh_port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {paths.host_key}",
        f"PidFile {paths.sshd_pidfile()}",
        *sshd_access(authorized_keys),
        "LogLevel VERBOSE",
        f"SetEnv SLURM_CONF={paths.slurm_conf} CORRAL_TESTBED_CLUSTER={spec.name}",
        "Subsystem sftp internal-sftp",
        "",
    ])


def render_cluster_config(
    specs: tuple[ClusterSpec, ...], client_key: Path, known_hosts: Path
) -> str:
    """The OpenSSH-syntax cluster file that Corral reads as ~/.slurm/config."""
    out = ["# Written by the Corral testbed: one Host per local test cluster."]
    for spec in specs:
        out += [
            f"Host {spec.name}",
            "    HostName 127.0.0.1",
            f"    Port {spec.ssh_port}",
            f"    User {TEST_USER}",
            f"    IdentityFile {client_key}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {known_hosts}",
            "    StrictHostKeyChecking yes",
            "",
        ]
    return "\n".join(out)
