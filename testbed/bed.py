"""Bring the local Slurm clusters up and down, and flip their fault switches.

Every cluster gets its own munged (socket and key), slurmctld (port, state, logs), one slurmd per
node (each in its own UTS namespace so `hostname` prints the node name) and an sshd as its login
node. All daemons run in the foreground of their own session, so the pid we start is the pid to kill.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
from datetime import datetime
from pathlib import Path

from testbed.accounting import Accounting
from testbed.machines import Machines
from testbed.standins import RUNTIME_STANDIN
from testbed.layout import (
    TestbedPaths,
    render_cluster_config,
    render_gres_conf,
    render_slurm_conf,
    render_sshd_config,
)
from testbed.processes import (
    TestbedError,
    descendants,
    kill_tree,
    port_open,
    run,
    running,
    signal_tree,
    spawn,
    spawn_as_host,
    wait_until,
)
from testbed.spec import (
    ALL_USERS,
    TEAM_GROUP,
    TEAM_USERS,
    TEST_USER,
    ClusterSpec,
    default_clusters,
    scale_clusters,
    testbed_root,
)

APT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "openssh-server", "openssh-client",
                "rsync", "sudo", "mariadb-server", "mariadb-client",
                "environment-modules",  # `module load`, as HPC sites have it (cluster profiles' setup_prefix)
                "tcsh", "zsh",  # users' login shells, which read the command lines ssh hands them
                "postgresql",  # not Slurm's: the team-mode state store, tested against a real server
                "chromium",  # nor this: the dashboard's tests drive it (Playwright, its system executable)
                "git")  # the workdir's ignore rules are tested against git's own (tests/sdk/test_ignore.py)
# Daemons must be started through links with exactly these names: libslurm decides what it is from
# argv[0]'s basename, and a slurmd started as `slurmd-wlm` silently loses its node GRES.
DAEMON_BINARIES = {"slurmctld": "/usr/sbin/slurmctld-wlm", "slurmd": "/usr/sbin/slurmd-wlm"}
CONFIG_MARKER = "# Written by the Corral testbed"
SUDOERS_EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "sudoers.example"
PROFILE_SCRIPT = Path("/etc/profile.d/corral-testbed.sh")
READY_TIMEOUT = 45.0
# A stand-in container runtime: no real one can run here (no user namespaces for them, no registry to
# pull from). It takes exactly what Corral generates, `RUNTIME exec [--nv] [--bind P] [--pwd P]
# docker://IMAGE CMD…`, and runs CMD on the host with the image named in CORRAL_TESTBED_CONTAINER.
# A stand-in CUDA module: no CUDA is installed, the module sets what a real one sets for a job to read.
CUDA_MODULEFILE = """#%Module1.0
## Written by the Corral testbed: a stand-in for {cluster}'s CUDA {version} module (no CUDA is installed).
setenv CUDA_VERSION {version}
setenv CUDA_HOME /opt/cuda-{version}
prepend-path PATH /opt/cuda-{version}/bin
"""


def install_packages() -> None:
    """apt-get install what the testbed needs, without letting postinst start system daemons."""
    missing = [b for b in ("/usr/sbin/slurmctld-wlm", "/usr/sbin/slurmd-wlm", "/usr/bin/sinfo", "/usr/sbin/slurmdbd",
                           "/usr/sbin/munged", "/usr/sbin/sshd", "/usr/bin/rsync", "/usr/bin/sudo", "/usr/sbin/mariadbd",
                           "/usr/share/postgresql-common", "/usr/bin/chromium", "/etc/profile.d/modules.sh",
                           "/usr/bin/tcsh", "/usr/bin/zsh")
               if not Path(b).exists()]
    if not missing:
        return
    policy = Path("/usr/sbin/policy-rc.d")
    created = not policy.exists()
    if created:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *APT_PACKAGES], env=env)
    finally:
        if created:
            policy.unlink()


# The daemons' fixed ports sit inside Linux's ephemeral range (32768-60999): an outgoing connection
# given one of them as its local port makes a daemon's bind fail ("Address already in use"). Reserved,
# the kernel hands them to no outgoing connection. Best effort: a container may not allow the write.
RESERVED_PORTS = ("47000-47299", "48000-48999")  # the three clusters'; the scale mode's (spec.scale_clusters)


def _reserve_ports() -> None:
    path = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
    try:
        current = path.read_text().strip()
        missing = [r for r in RESERVED_PORTS if r not in current.split(",")]
        if missing:
            path.write_text(",".join(filter(None, [current, *missing])) + "\n")
    except OSError:
        pass


class Testbed:
    def __init__(self, root: Path | None = None, clusters: tuple[ClusterSpec, ...] | None = None,
                 main: bool = True):
        """`main`: the testbed the tests and the user's ~/.slurm/config use. Another (the scale mode's,
        `scale_testbed`) leaves the login shells' profile script and the user's cluster file alone."""
        self.paths = TestbedPaths(root or testbed_root())
        self.clusters = clusters or default_clusters()
        self.main = main

    # ---- lookup -------------------------------------------------------------------------------
    def spec(self, cluster: str) -> ClusterSpec:
        for spec in self.clusters:
            if spec.name == cluster:
                return spec
        known = ", ".join(s.name for s in self.clusters)
        raise TestbedError(f"no testbed cluster {cluster!r} (known: {known})")

    def cluster_of_node(self, node: str) -> ClusterSpec:
        for spec in self.clusters:
            if any(n.name == node for n in spec.nodes):
                return spec
        raise TestbedError(f"no testbed node {node!r}")

    def accounting(self, spec: ClusterSpec) -> Accounting | None:
        if not spec.accounting:
            return None
        paths = self.paths.cluster(spec.name)
        return Accounting(spec, paths.root / "accounting", paths.etc, paths.munge_socket, self.paths.bin,
                          self.slurm_env(spec.name))

    def slurm_env(self, cluster: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.paths.cluster(cluster).slurm_conf)}

    @property
    def cluster_config(self) -> Path:
        return self.paths.cluster_config

    @property
    def machines(self) -> Machines:
        """The plain SSH machines (an `ssh/<pool>`'s), brought up with `up(machines=True)`."""
        return Machines(self.paths.root, self.paths.authorized_keys, self.paths.client_key)

    # ---- whole testbed ------------------------------------------------------------------------
    def up(self, install_user_config: bool = True, machines: bool = False) -> None:
        if os.geteuid() != 0:
            raise TestbedError("the testbed needs root (it starts slurmd, munged and sshd)")
        # Its files are read by daemons running as other users (the controller's, corral-test): they
        # must not inherit a caller's umask of 077 (a careful user's, or a process that ran Corral's CLI).
        previous = os.umask(0o022)
        try:
            self._up(install_user_config)
            if machines:
                self.machines.up()
        finally:
            os.umask(previous)

    def _up(self, install_user_config: bool) -> None:
        install_packages()
        _reserve_ports()
        self._ensure_user()
        if self.main:
            self._ensure_profile_script()
        self._ensure_binaries()
        self._ensure_client_key()
        for spec in self.clusters:
            self._write_cluster_files(spec)
        self._write_known_hosts()
        self.paths.cluster_config.write_text(
            render_cluster_config(self.clusters, self.paths.client_key, self.paths.known_hosts)
        )
        for spec in self.clusters:
            self._start_cluster(spec)
        for spec in self.clusters:
            self.wait_ready(spec.name)
        if install_user_config and self.main:
            self._install_user_config()

    def down(self, purge: bool = False) -> None:
        if self.machines.root.exists():
            self.machines.down()
        for spec in self.clusters:
            paths = self.paths.cluster(spec.name)
            self.stop_login(spec.name)
            for node in spec.nodes:
                self._stop(paths.slurmd_pidfile(node.name))
            self._stop(paths.ctld_pidfile())
            accounting = self.accounting(spec)
            for pidfile in accounting.pidfiles() if accounting else []:
                self._stop(pidfile)
            self._stop(paths.run / "munged.pid")
        if purge and self.paths.root.exists():
            shutil.rmtree(self.paths.root)

    def status(self) -> dict[str, dict[str, bool]]:
        report: dict[str, dict[str, bool]] = {}
        for spec in self.clusters:
            paths = self.paths.cluster(spec.name)
            entry = {
                "munged": running(paths.run / "munged.pid") is not None,
                "slurmctld": running(paths.ctld_pidfile()) is not None,
                "login": running(paths.sshd_pidfile()) is not None,
            }
            for node in spec.nodes:
                entry[f"slurmd:{node.name}"] = running(paths.slurmd_pidfile(node.name)) is not None
            accounting = self.accounting(spec)
            if accounting:
                entry["mariadbd"] = running(accounting.db_pidfile) is not None
                entry["slurmdbd"] = running(accounting.dbd_pidfile) is not None
            report[spec.name] = entry
        return report

    # ---- fault switches -----------------------------------------------------------------------
    def stop_controller(self, cluster: str) -> None:
        """Stop the cluster's slurmctld and wait until it has gone: one still shutting down can answer
        `scontrol ping` and then fail the next command, which is not what a stopped controller does."""
        pidfile = self.paths.cluster(self.spec(cluster).name).ctld_pidfile()
        self._stop(pidfile)
        wait_until(f"{cluster} slurmctld to stop", lambda: running(pidfile) is None, READY_TIMEOUT)

    def start_controller(self, cluster: str) -> None:
        self._start_ctld(self.spec(cluster))
        self.wait_ready(cluster)

    def freeze_controller(self, cluster: str) -> None:
        """The cluster's slurmctld stopped in its tracks (SIGSTOP): alive but silent, as a controller
        swamped by RPCs. squeue against it fails after ~10 s (MessageTimeout 5 s, tried twice) and
        `scontrol ping` after ~5 s. `thaw_controller` (or `up`) resumes it."""
        pid = running(self.paths.cluster(self.spec(cluster).name).ctld_pidfile())
        if pid is None:
            raise TestbedError(f"{cluster}: slurmctld is not running")
        os.kill(pid, signal.SIGSTOP)

    def thaw_controller(self, cluster: str) -> None:
        pid = running(self.paths.cluster(self.spec(cluster).name).ctld_pidfile())
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    def limit_jobs(self, cluster: str, count: int | None) -> None:
        """Restart the controller with `MaxJobCount=count` (None: Slurm's default, 10000). A controller
        that holds that many job records (MinJobAge keeps finished ones a day) refuses new jobs, and
        sbatch sleeps and retries: what a busy site's full job table looks like."""
        spec = self.spec(cluster)
        paths = self.paths.cluster(spec.name)
        paths.slurm_conf.write_text(render_slurm_conf(spec, paths, max_job_count=count))
        self.stop_controller(cluster)
        self.start_controller(cluster)

    def light_squeue(self, cluster: str, on: bool = True) -> Path:
        """Give the cluster's login node a squeue with the `--only-job-state` option of newer Slurm,
        which Debian 12's 22.05 lacks (off: the plain one again); returns its call log.

        The option's light RPC answers job ids and states only, of every user's jobs; this squeue
        answers the same from the full RPC, so what Corral does with the answers runs against the
        real queue, while the RPC itself is not exercised. Each call logs `light` or `full` and its arguments."""
        paths = self.paths.cluster(self.spec(cluster).name)
        wrapper, log = paths.runtime_bin / "squeue", paths.root / "squeue-calls.log"
        if not on:
            wrapper.unlink(missing_ok=True)
            return log
        log.write_text("")
        log.chmod(0o666)
        wrapper.write_text(LIGHT_SQUEUE.format(log=log))
        wrapper.chmod(0o755)
        return log

    def stop_login(self, cluster: str) -> None:
        # Kill the listener and every per-connection sshd below it, so that live ControlMaster
        # connections die too, as they would when a login node goes down.
        self._stop(self.paths.cluster(self.spec(cluster).name).sshd_pidfile())

    def freeze_login(self, cluster: str) -> None:
        """The login node stops answering, connections stay open: SIGSTOP its sshd and every
        connection (and session) under it, as a hung or overloaded login node looks from outside."""
        pid = running(self.paths.cluster(self.spec(cluster).name).sshd_pidfile())
        if pid is None:
            raise TestbedError(f"{cluster}'s login sshd is not running")
        signal_tree(pid, signal.SIGSTOP)

    def thaw_login(self, cluster: str) -> None:
        pid = running(self.paths.cluster(self.spec(cluster).name).sshd_pidfile())
        if pid is not None:
            signal_tree(pid, signal.SIGCONT)

    def start_login(self, cluster: str) -> None:
        spec = self.spec(cluster)
        self._start_sshd(spec)
        wait_until(f"{cluster} login sshd", lambda: port_open(spec.ssh_port), READY_TIMEOUT)

    def freeze_node(self, node: str) -> None:
        """The node's slurmd stops answering while slurmctld still counts it up (until SlurmdTimeout):
        SIGSTOP the daemon alone (running jobs' slurmstepds go on), as a hung node looks to a step launch."""
        spec = self.cluster_of_node(node)
        pid = running(self.paths.cluster(spec.name).slurmd_pidfile(node))
        if pid is None:
            raise TestbedError(f"{node}'s slurmd is not running")
        os.kill(pid, signal.SIGSTOP)

    def thaw_node(self, node: str) -> None:
        spec = self.cluster_of_node(node)
        pid = running(self.paths.cluster(spec.name).slurmd_pidfile(node))
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    def kill_node(self, node: str) -> None:
        spec = self.cluster_of_node(node)
        self._stop(self.paths.cluster(spec.name).slurmd_pidfile(node), sig=signal.SIGKILL)

    def start_node(self, node: str) -> None:
        """Start a node's slurmd (if it is not running) and wait until that slurmd has registered.

        Right after a kill the controller still shows the node idle, so readiness alone would pass
        before the new daemon is up, and while it truncates and rewrites its pid file."""
        spec = self.cluster_of_node(node)
        paths = self.paths.cluster(spec.name)
        since = datetime.now().replace(microsecond=0)
        daemon = self._start_slurmd(spec, node)
        if daemon is not None:

            def registered() -> bool:
                if daemon.poll() is not None:
                    raise daemon_exited(f"{node}'s slurmd", paths.log / f"slurmd-{node}.out")
                started = self._slurmd_started(spec.name, node)
                return running(paths.slurmd_pidfile(node)) is not None and started is not None and started >= since

            wait_until(f"{node}'s new slurmd to register", registered, READY_TIMEOUT, 0.25)
        self.wait_ready(spec.name, nodes=[node])

    def _slurmd_started(self, cluster: str, node: str) -> datetime | None:
        """When the node's registered slurmd started, as the controller reports it (local time)."""
        proc = run(["scontrol", "-o", "show", "node", node], env=self.slurm_env(cluster), check=False)
        for field in proc.stdout.split():
            if field.startswith("SlurmdStartTime="):
                try:
                    return datetime.fromisoformat(field.split("=", 1)[1])
                except ValueError:
                    return None
        return None

    def drain(self, node: str, reason: str = "testbed drain") -> None:
        self.scontrol(self.cluster_of_node(node).name, "update", f"NodeName={node}", "State=DRAIN",
                      f"Reason={reason}")

    def resume(self, node: str) -> None:
        cluster = self.cluster_of_node(node).name
        proc = run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=self.slurm_env(cluster),
                   check=False)
        # A node that is not drained or down (e.g. back by ReturnToService) cannot be resumed: fine.
        if proc.returncode != 0 and "Invalid node state" not in proc.stderr:
            raise TestbedError(f"resume {node} failed: {proc.stderr.strip()}")
        # Slurm marks a resumed node not-responding ("idle*") until its next ping comes back.
        self.wait_ready(cluster, nodes=[node])

    def scontrol(self, cluster: str, *args: str) -> str:
        return run(["scontrol", *args], env=self.slurm_env(cluster)).stdout

    def node_states(self, cluster: str) -> dict[str, str]:
        proc = run(["timeout", "10", "sinfo", "-h", "-N", "-o", "%N %t"], env=self.slurm_env(cluster),
                   check=False)
        states: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            name, _, state = line.partition(" ")
            states[name] = state.strip()
        return states

    def wait_ready(self, cluster: str, nodes: list[str] | None = None) -> None:
        """Wait until the controller answers and the given nodes (default: all) have registered."""
        spec = self.spec(cluster)
        wanted = nodes or [n.name for n in spec.nodes]
        bad_states = ("unk", "down", "inval", "fail", "comp")

        def ready() -> bool:
            states = self.node_states(cluster)
            return all(
                n in states and not states[n].endswith("*") and not states[n].startswith(bad_states)
                for n in wanted
            )

        wait_until(f"{cluster}: nodes {','.join(wanted)} to register", ready, READY_TIMEOUT, 0.25)

    # ---- internals ----------------------------------------------------------------------------
    def _ensure_user(self) -> None:
        for user in ALL_USERS:
            try:
                pwd.getpwnam(user)
            except KeyError:
                run(["useradd", "--create-home", "--shell", "/bin/bash", user])
            # sshd refuses accounts whose password field is locked ("!"); "*" means "no password".
            run(["usermod", "-p", "*", user])
            # Each person's files are their own, as on a real cluster's shared home.
            Path(pwd.getpwnam(user).pw_dir).chmod(0o700)
        self._ensure_sudo_rule()

    def _ensure_sudo_rule(self) -> None:
        """The team's members in one group, and docs/sudoers.example as it ships (the test user is the
        service account): what a site installs for `submit_as: sudo`."""
        try:
            grp.getgrnam(TEAM_GROUP)
        except KeyError:
            run(["groupadd", TEAM_GROUP])
        for user in TEAM_USERS:
            run(["usermod", "-aG", TEAM_GROUP, user])
        rule = SUDOERS_EXAMPLE.read_text().replace("corral-svc", TEST_USER).replace("corral-team", TEAM_GROUP)
        target = Path("/etc/sudoers.d/corral-testbed")
        if not target.exists() or target.read_text() != rule:
            staged = target.with_name(".corral-testbed.new")
            staged.write_text(rule)
            staged.chmod(0o440)
            run(["visudo", "-cqf", str(staged)])  # a broken rule must never reach sudo
            staged.rename(target)

    def _ensure_binaries(self) -> None:
        self.paths.bin.mkdir(parents=True, exist_ok=True)
        self.paths.root.chmod(0o755)
        for name, target in DAEMON_BINARIES.items():
            link = self.paths.bin / name
            if not link.is_symlink() or os.readlink(link) != target:
                link.unlink(missing_ok=True)
                link.symlink_to(target)

    def _ensure_client_key(self) -> None:
        """A key per user (the test user's, and each team member's), and sshd's per-user authorized
        keys: each key opens its own account only."""
        authorized = self.paths.authorized_keys
        authorized.mkdir(parents=True, exist_ok=True)
        authorized.chmod(0o755)
        for user in ALL_USERS:
            key = self.paths.user_key(user)
            key.parent.mkdir(parents=True, exist_ok=True)
            key.parent.chmod(0o755)
            if not key.exists():
                run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"testbed-{user}", "-f", str(key)])
            (authorized / user).write_text(Path(f"{key}.pub").read_text())
            (authorized / user).chmod(0o644)

    def _write_cluster_files(self, spec: ClusterSpec) -> None:
        paths = self.paths.cluster(spec.name)
        for d in (paths.etc, paths.state, paths.spool, paths.run, paths.log, paths.dev):
            d.mkdir(parents=True, exist_ok=True)
        paths.root.chmod(0o755)
        paths.munge_dir.mkdir(mode=0o755, exist_ok=True)
        paths.munge_dir.chmod(0o755)
        if not paths.munge_key.exists():
            run(["mungekey", "--create", f"--keyfile={paths.munge_key}"])
        paths.munge_key.chmod(0o600)
        if not paths.host_key.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{spec.name}-login", "-f",
                 str(paths.host_key)])
        for node in spec.nodes:
            # slurmd 22.05 drops GPU records without device files and wants character devices.
            node_dev = paths.dev / node.name
            node_dev.mkdir(exist_ok=True)
            for i in range(node.gpus):
                link = node_dev / f"nvidia{i}"
                if not link.is_symlink():
                    link.symlink_to("/dev/null")
            (paths.spool / node.name).mkdir(exist_ok=True)
        self._write_site_files(spec)
        paths.slurm_conf.write_text(render_slurm_conf(spec, paths))
        paths.gres_conf.write_text(render_gres_conf(spec, paths))
        paths.sshd_config.write_text(
            render_sshd_config(spec, paths, self.paths.authorized_keys)
        )

    def _write_site_files(self, spec: ClusterSpec) -> None:
        """What differs between sites for the same task: a module tree with this site's CUDA versions,
        and a scratch directory of its own."""
        paths = self.paths.cluster(spec.name)
        cuda = paths.modules / "cuda"
        cuda.mkdir(parents=True, exist_ok=True)
        for stale in cuda.iterdir():
            if stale.name not in spec.cuda_modules:
                stale.unlink()
        for version in spec.cuda_modules:
            (cuda / version).write_text(CUDA_MODULEFILE.format(version=version, cluster=spec.name))
        paths.scratch.mkdir(exist_ok=True)
        paths.scratch.chmod(0o1777)
        paths.runtime_bin.mkdir(exist_ok=True)
        for runtime in ("apptainer", "singularity"):
            standin = paths.runtime_bin / runtime
            if runtime in spec.container_runtimes:
                standin.write_text(RUNTIME_STANDIN.format(runtime=runtime))
                standin.chmod(0o755)
            elif standin.exists():
                standin.unlink()

    def _ensure_profile_script(self) -> None:
        """Each site's own PATH additions in its login shells, as sites do in /etc/profile.d (a login
        shell's /etc/profile resets PATH, so sshd's SetEnv cannot carry them)."""
        PROFILE_SCRIPT.write_text(
            "# Written by the Corral testbed: the login node's site-specific PATH (its container runtimes), and\n"
            "# its module tree on MODULEPATH (job scripts' `module load`, in login shells: `#!/bin/bash -l`).\n"
            f'if [ -n "${{CORRAL_TESTBED_CLUSTER:-}}" ] && [ -d "{self.paths.root}/$CORRAL_TESTBED_CLUSTER/runtime-bin" ]; then\n'
            f'  PATH="{self.paths.root}/$CORRAL_TESTBED_CLUSTER/runtime-bin:$PATH"\n'
            "fi\n"
            f'if [ -n "${{CORRAL_TESTBED_CLUSTER:-}}" ] && [ -d "{self.paths.root}/$CORRAL_TESTBED_CLUSTER/modules" ]; then\n'
            f'  export MODULEPATH="{self.paths.root}/$CORRAL_TESTBED_CLUSTER/modules${{MODULEPATH:+:$MODULEPATH}}"\n'
            "fi\n"
            "# An SSH machine's stand-in nvidia-smi (testbed/machines.py).\n"
            f'if [ -n "${{CORRAL_TESTBED_MACHINE:-}}" ] && [ -d "{self.paths.root}/machines/$CORRAL_TESTBED_MACHINE/bin" ]; then\n'
            f'  PATH="{self.paths.root}/machines/$CORRAL_TESTBED_MACHINE/bin:$PATH"\n'
            "fi\n")
        PROFILE_SCRIPT.chmod(0o644)

    def _write_known_hosts(self) -> None:
        lines = []
        for spec in self.clusters:
            pub = Path(f"{self.paths.cluster(spec.name).host_key}.pub").read_text().split()
            lines.append(f"[127.0.0.1]:{spec.ssh_port} {pub[0]} {pub[1]}")
        self.paths.known_hosts.write_text("\n".join(lines) + "\n")

    def _start_cluster(self, spec: ClusterSpec) -> None:
        paths = self.paths.cluster(spec.name)
        fresh = not any(self.status()[spec.name].values())
        if fresh:
            # A cluster brought up from nothing starts with an empty queue.
            for d in (paths.state, paths.spool):
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir()
            for node in spec.nodes:
                (paths.spool / node.name).mkdir()
        if not running(paths.run / "munged.pid"):
            proc = spawn(
                ["munged", "--foreground", "--force", f"--socket={paths.munge_socket}",
                 f"--key-file={paths.munge_key}", f"--pid-file={paths.run / 'munged.pid'}",
                 f"--log-file={paths.log / 'munged.log'}", f"--seed-file={paths.munge_dir / 'seed'}"],
                paths.log / "munged.out",
            )
            (paths.run / "munged.pid").write_text(f"{proc.pid}\n")
            wait_until(f"{spec.name} munged", lambda: paths.munge_socket.exists() or proc.poll() is not None, 10)
            if proc.poll() is not None:
                raise TestbedError(f"{spec.name}: munged exited; see {paths.log / 'munged.out'}")
        accounting = self.accounting(spec)
        if accounting:
            if fresh:
                accounting.wipe()  # job ids restart at 1: old records would collide
            accounting.start()
        self._start_ctld(spec)
        for node in spec.nodes:
            self._start_slurmd(spec, node.name)
        self._start_sshd(spec)
        wait_until(f"{spec.name} login sshd", lambda: port_open(spec.ssh_port), READY_TIMEOUT)

    def _start_ctld(self, spec: ClusterSpec) -> None:
        paths = self.paths.cluster(spec.name)
        if pid := running(paths.ctld_pidfile()):
            os.kill(pid, signal.SIGCONT)  # one a test left frozen (freeze_controller) answers again
            return
        log = paths.log / "slurmctld.out"
        spawn_as_host(spec.ctld_host, [str(self.paths.bin / "slurmctld"), "-D", "-i"], log, paths.ctld_pidfile(),
                      env=self.slurm_env(spec.name))

        def listening() -> bool:
            if not running(paths.ctld_pidfile()):
                raise daemon_exited(f"{spec.name}: slurmctld", log)
            return port_open(spec.ctld_port)

        wait_until(f"{spec.name} slurmctld port", listening, READY_TIMEOUT)

    def _start_slurmd(self, spec: ClusterSpec, node: str) -> subprocess.Popen[bytes] | None:
        paths = self.paths.cluster(spec.name)
        if running(paths.slurmd_pidfile(node)):
            return None
        return spawn_as_host(node, [str(self.paths.bin / "slurmd"), "-D", "-N", node],
                             paths.log / f"slurmd-{node}.out", paths.slurmd_pidfile(node),
                             env=self.slurm_env(spec.name), own_ptys=True)

    def _start_sshd(self, spec: ClusterSpec) -> None:
        paths = self.paths.cluster(spec.name)
        if running(paths.sshd_pidfile()):
            return
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        run(["/usr/sbin/sshd", "-t", "-f", str(paths.sshd_config)])
        proc = spawn(["/usr/sbin/sshd", "-D", "-e", "-f", str(paths.sshd_config)], paths.log / "sshd.log")
        paths.sshd_pidfile().write_text(f"{proc.pid}\n")

    def _stop(self, pidfile: Path, sig: int = signal.SIGTERM) -> None:
        pid = running(pidfile)
        if pid:
            kill_tree(pid, sig)

    def _install_user_config(self) -> None:
        """Make the testbed the user's cluster file, unless they have a real one of their own."""
        target = Path.home() / ".slurm" / "config"
        if target.exists() and not target.read_text().startswith(CONFIG_MARKER):
            print(f"note: {target} is not the testbed's; use CORRAL_SLURM_CONFIG={self.paths.cluster_config}")
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.paths.cluster_config.read_text())


LIGHT_SQUEUE = """\
#!/bin/bash
# Written by the Corral testbed (Testbed.light_squeue): squeue with newer Slurm's --only-job-state.
args=() kind=full
for a in "$@"; do
  if [ "$a" = --only-job-state ]; then kind=light; else args+=("$a"); fi
done
echo "$kind $*" >>{log}
exec /usr/bin/squeue "${{args[@]}}"
"""


def scale_testbed(count: int) -> Testbed:
    """`count` small clusters of their own (`python -m testbed up --clusters N`), beside the main three:
    their own directory, ports, daemons and cluster file (`config-path --clusters N`)."""
    return Testbed(testbed_root() / "scale", scale_clusters(count), main=False)


def daemons_memory_mb(bed: Testbed) -> float:
    """The resident memory of every daemon of the testbed's clusters (munged, slurmctld, slurmd, the
    login sshd and their children), in MB, from /proc."""
    pids: list[int] = []
    for spec in bed.clusters:
        paths = bed.paths.cluster(spec.name)
        for pidfile in [paths.run / "munged.pid", paths.ctld_pidfile(), paths.sshd_pidfile(),
                        *(paths.slurmd_pidfile(n.name) for n in spec.nodes)]:
            if (pid := running(pidfile)) is not None:
                pids += [pid, *descendants(pid)]
    total_kb = 0
    for pid in set(pids):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total_kb += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total_kb / 1024


def daemon_exited(what: str, log: Path) -> TestbedError:
    """A daemon that died while we waited for it, with the last lines of its log."""
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    return TestbedError(f"{what} exited: {' | '.join(tail)} (see {log})")


def sinfo_summary(bed: Testbed) -> str:
    out = []
    for spec in bed.clusters:
        proc = subprocess.run(["timeout", "10", "sinfo"], env=bed.slurm_env(spec.name), capture_output=True,
                              text=True)
        out.append(f"== {spec.name}\n{proc.stdout or proc.stderr}")
    return "\n".join(out)
