"""The SSH transport against real sshd login nodes: errors, ControlMaster reuse, ProxyJump."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.config import load_registry
from corral.errors import ClusterUnreachableError, ConfigError, HostKeyError, RemoteCommandError, SshAuthError
from corral.ssh import SshTransport, control_dir
from tests.conftest import wait_for
from tests.helpers import host_block, option, runs_somewhere


def transport_for(path: Path) -> SshTransport:
    return SshTransport(load_registry(path), timeout=10)


def run(transport: SshTransport, cluster: str, script: str, **kw):
    return asyncio.run(transport.run(cluster, script, timeout=20, **kw))


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "slurm-config"
    path.write_text(text)
    return path


def test_script_runs_on_the_login_node_with_the_clusters_slurm(testbed, corral_env):
    transport = transport_for(testbed.cluster_config)
    result = run(transport, "borealis", 'echo "$USER $CORRAL_TESTBED_CLUSTER"; printf "%s\\n" "$SLURM_CONF"')
    user, cluster = result.stdout.splitlines()[0].split()
    assert (user, cluster) == ("corral-test", "borealis")
    assert result.stdout.splitlines()[1].endswith("/borealis/etc/slurm.conf")


def test_control_master_is_reused(testbed, corral_env):
    transport = transport_for(testbed.cluster_config)
    # The remote shell runs under timeout(1), itself under the sshd process of the connection.
    connection = "awk '/^PPid/ {print $2}' /proc/$PPID/status"
    first = run(transport, "alpine", connection).stdout.strip()
    second = run(transport, "alpine", connection).stdout.strip()
    sockets = list(control_dir().iterdir())
    assert len(sockets) == 1 and sockets[0].is_socket()
    # Both sessions were served by one sshd connection process: the master's.
    assert first and first == second
    assert transport.round_trips["alpine"] == 2


def test_remote_failure_carries_status_and_stderr(testbed, corral_env):
    transport = transport_for(testbed.cluster_config)
    with pytest.raises(RemoteCommandError) as err:
        run(transport, "alpine", "echo oops >&2; exit 3")
    assert err.value.exit_status == 3 and "oops" in str(err.value) and str(err.value).startswith("alpine: ")
    assert run(transport, "alpine", "exit 3", check=False).exit_status == 3


def test_wrong_key_is_an_auth_error(testbed, corral_env, tmp_path):
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    block = host_block(testbed.cluster_config.read_text(), "alpine")
    path = write_config(tmp_path, block.replace(option(block, "IdentityFile"), str(tmp_path / "other")))
    with pytest.raises(SshAuthError, match=r"alpine: the login node refused our key .*IdentityFile for Host alpine"):
        run(transport_for(path), "alpine", "true")


def test_unknown_host_key_is_a_host_key_error(testbed, corral_env, tmp_path):
    block = host_block(testbed.cluster_config.read_text(), "alpine")
    (tmp_path / "known_hosts").write_text("")
    path = write_config(tmp_path, block.replace(option(block, "UserKnownHostsFile"), str(tmp_path / "known_hosts")))
    with pytest.raises(HostKeyError, match="alpine: the login node's host key is unknown or changed"):
        run(transport_for(path), "alpine", "true")


def test_refused_connection(testbed, corral_env, tmp_path):
    block = host_block(testbed.cluster_config.read_text(), "alpine")
    path = write_config(tmp_path, block.replace(f"Port {option(block, 'Port')}", "Port 1"))
    with pytest.raises(ClusterUnreachableError, match="alpine: login node refused the connection"):
        run(transport_for(path), "alpine", "true")


def test_an_ssh_that_dies_without_a_word_is_a_lost_connection(tmp_path):
    """ssh exits 255 with nothing on stderr when a shared connection dies or keepalives go unanswered
    (a login node that froze): the user is told that, not "ssh failed: no error output"."""
    transport = transport_for(write_config(tmp_path, "Host alpine\n    HostName 127.0.0.1\n"))
    silent = transport.classify_failure("alpine", "\n")
    assert isinstance(silent, ClusterUnreachableError)
    assert str(silent) == ("alpine: lost the connection to the login node (ssh exited 255 and said nothing); "
                           "is it up? `corral check` tells")
    said = transport.classify_failure("alpine", "kex_exchange_identification: read: Connection reset by peer\n")
    assert str(said) == "alpine: ssh failed: kex_exchange_identification: read: Connection reset by peer"


def test_a_pool_machine_that_does_not_answer_is_called_a_machine_not_a_login_node(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("pools: {lab: {hosts: [lab1]}}\n")
    monkeypatch.setenv("CORRAL_HOME", str(home))
    transport = transport_for(write_config(tmp_path, "Host alpine lab1\n    HostName 127.0.0.1\n"))
    said = transport.classify_failure("lab1", "ssh: connect to host 10.0.0.1 port 22: Connection timed out\n")
    assert str(said) == "lab1: connection to the machine timed out (ssh: connect to host 10.0.0.1 port 22: " \
                        "Connection timed out)"
    assert "login node refused" in str(transport.classify_failure("alpine", "Connection refused\n"))
    assert str(transport.classify_failure("lab1", "Connection refused\n")) == \
        "lab1: machine refused the connection (is sshd running?)"


def test_unresolvable_host_names_the_entry(testbed, corral_env, tmp_path):
    path = write_config(tmp_path, "# comment\nHost ghost.invalid\n    User corral-test\n")
    with pytest.raises(ClusterUnreachableError) as err:
        run(transport_for(path), "ghost.invalid", "true")
    assert str(err.value) == (
        "ghost.invalid: login node address 'ghost.invalid' does not resolve; "
        f"set HostName for Host ghost.invalid ({path}:2)"
    )


def test_bad_ssh_option_names_file_and_line(testbed, corral_env, tmp_path):
    block = host_block(testbed.cluster_config.read_text(), "alpine")
    path = write_config(tmp_path, block + "    NoSuchOption yes\n")
    with pytest.raises(ConfigError) as err:
        run(transport_for(path), "alpine", "true")
    assert str(err.value).startswith(f"{path}:{len(block.splitlines()) + 1}: Bad configuration option")


def test_timeout_kills_the_call(testbed, corral_env):
    transport = transport_for(testbed.cluster_config)
    with pytest.raises(Exception) as err:
        asyncio.run(transport.run("alpine", "sleep 30", timeout=1))
    assert type(err.value).__name__ == "SshTimeoutError" and "within 1s" in str(err.value)


def test_proxyjump_through_another_login_node(testbed, corral_env, tmp_path):
    """cirrus reached only through alpine's login node, as sites with a bastion do."""
    text = testbed.cluster_config.read_text()
    alpine, cirrus = host_block(text, "alpine"), host_block(text, "cirrus")
    jump = f"    ProxyJump corral-test@127.0.0.1:{option(alpine, 'Port')}\n"
    shared = (f"Host *\n    IdentityFile {option(cirrus, 'IdentityFile')}\n"
              f"    UserKnownHostsFile {option(cirrus, 'UserKnownHostsFile')}\n")
    path = write_config(tmp_path, cirrus + jump + shared)
    jump_log = testbed.paths.cluster("alpine").log / "sshd.log"
    before = jump_log.read_text().count("Accepted publickey")
    transport = transport_for(path)
    for _ in range(3):
        assert run(transport, "cirrus", "echo $CORRAL_TESTBED_CLUSTER").stdout.strip() == "cirrus"
    # One connection through the jump host served all three calls: the master was reused.
    assert jump_log.read_text().count("Accepted publickey") - before == 1


@pytest.mark.parametrize("remote_rsync", ["rsync", "/nonexistent/rsync"])
def test_sync_with_rsync_or_a_tar_stream(testbed, corral_env, tmp_path, monkeypatch, remote_rsync):
    """Files arrive byte for byte whether the cluster has rsync or only tar."""
    import uuid

    from tests.helpers import ssh_login

    monkeypatch.setenv("CORRAL_REMOTE_RSYNC", remote_rsync)
    src = tmp_path / "src dir"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"line\r\n\x00binary \xff")
    (src / "sub" / "it's.py").write_text("print('x')\n")
    single = tmp_path / "one file"
    single.write_text("single\n")
    dest = f".corral/test-sync/{uuid.uuid4().hex[:8]} x"
    transport = transport_for(testbed.cluster_config)

    async def go():
        await transport.sync("borealis", src, f"{dest}/tree/")
        await transport.sync("borealis", single, f"{dest}/deep/one")

    asyncio.run(go())
    quoted = dest.replace(" ", "\\ ")
    listing = ssh_login(testbed.cluster_config, "borealis",
                        f"cd {quoted} && find . -type f | sort && od -An -c tree/a.txt && cat deep/one")
    assert listing.splitlines()[:3] == ["./deep/one", "./tree/a.txt", "./tree/sub/it's.py"]
    assert "\\r  \\n  \\0   b   i   n" in listing and listing.endswith("single\n")
    assert ("borealis" in transport._no_remote_rsync) is (remote_rsync != "rsync")
    ssh_login(testbed.cluster_config, "borealis", f"rm -rf {quoted}")


def effective_options(transport: SshTransport, host: str) -> dict[str, str]:
    """What ssh itself will use for `host` with Corral's config (`ssh -G`: no connection made)."""
    import subprocess

    out = subprocess.run(["ssh", "-G", "-F", str(transport.config_file), "--", host], capture_output=True,
                         text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_the_users_ssh_settings_win_over_corrals_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))
    path = write_config(tmp_path, "Host mine\n    HostName 127.0.0.1\n    ConnectTimeout 2\n"
                                  "    ServerAliveInterval 30\n    BatchMode no\n    ControlPersist 60\n"
                                  "Host plain\n    HostName 127.0.0.1\n")
    transport = SshTransport(load_registry(path), timeout=12)
    mine, plain = effective_options(transport, "mine"), effective_options(transport, "plain")
    assert (mine["connecttimeout"], mine["serveraliveinterval"], mine["batchmode"], mine["controlpersist"]) == (
        "2", "30", "no", "60")
    # Where the user said nothing, Corral's defaults, all derived from the one timeout.
    assert (plain["connecttimeout"], plain["serveraliveinterval"], plain["serveralivecountmax"],
            plain["batchmode"]) == ("5", "4", "2", "yes")
    assert plain["controlpath"].startswith(str(control_dir()))
    assert "-o" not in transport.ssh_argv("plain", ["true"])  # nothing on the command line to override them
    assert oct(transport.config_file.stat().st_mode & 0o777) == "0o600"


def test_an_option_like_local_name_is_copied_not_run(testbed, corral_env, tmp_path, monkeypatch):
    """A directory or file named like an rsync/tar option is a path, never an option: nothing runs
    locally, and the files arrive."""
    from tests.helpers import ssh_login

    canary = tmp_path / "pwned"
    for remote_rsync in ("rsync", "/nonexistent/rsync"):  # rsync, then the tar stream fallback
        monkeypatch.setenv("CORRAL_REMOTE_RSYNC", remote_rsync)
        monkeypatch.chdir(tmp_path)
        folder = tmp_path / "-esh -c 'touch pwned' #"  # run from tmp_path, it would make the canary
        folder.mkdir(exist_ok=True)
        (folder / "inside.txt").write_text("inside\n")
        single = tmp_path / "--rsh=sh -c 'touch pwned' #"
        single.write_text("single\n")
        transport = transport_for(testbed.cluster_config)

        async def go():
            # Relative names, as a task's workdir and file_mounts give them.
            await transport.sync("alpine", Path(folder.name), ".corral/test-inject/tree/")
            await transport.sync("alpine", Path(single.name), ".corral/test-inject/one; touch ~/pwned-remote")

        asyncio.run(go())
        assert not canary.exists()
        listing = ssh_login(testbed.cluster_config, "alpine",
                            "cat .corral/test-inject/tree/inside.txt '.corral/test-inject/one; touch ~/pwned-remote'; "
                            "test -e ~/pwned-remote && echo REMOTE-CANARY; rm -rf .corral/test-inject")
        assert listing == "inside\nsingle\n"


@pytest.mark.parametrize("remote_rsync", ["rsync", "/nonexistent/rsync"])
def test_a_mirroring_sync_deletes_what_the_source_no_longer_has(testbed, corral_env, tmp_path, monkeypatch,
                                                                remote_rsync):
    """A workdir's cluster-side cache is a mirror of the last workdir sent: a file deleted locally goes
    there too (rsync --delete, or a fresh folder for the tar stream); a plain sync leaves it."""
    import uuid

    from tests.helpers import ssh_login

    monkeypatch.setenv("CORRAL_REMOTE_RSYNC", remote_rsync)
    src = tmp_path / "work"
    (src / "sub").mkdir(parents=True)
    for name in ("a.py", "old.py", "sub/b.py"):
        (src / name).write_text(name)
    transport = transport_for(testbed.cluster_config)
    dest = f".corral/test-mirror/{uuid.uuid4().hex[:8]}"

    def synced(into: str, mirror: bool) -> list[str]:
        asyncio.run(transport.sync("alpine", src, f"{dest}/{into}/", mirror=mirror))
        out = ssh_login(testbed.cluster_config, "alpine", f"cd {dest}/{into} && find . -type f | sort")
        return [line.removeprefix("./") for line in out.split()]

    assert synced("mirror", True) == synced("plain", False) == ["a.py", "old.py", "sub/b.py"]
    (src / "old.py").unlink()
    assert synced("mirror", True) == ["a.py", "sub/b.py"]
    assert synced("plain", False) == ["a.py", "old.py", "sub/b.py"]
    ssh_login(testbed.cluster_config, "alpine", f"rm -rf {dest}")


def test_a_burst_of_requests_shares_probes_and_session_slots(testbed, corral_env):
    """The server makes one Client per request. 60 probes asked at once, each through its own Client,
    cost one probe per cluster; and however many transports run scripts at once, one login node never
    has more than the session limit open."""
    from corral.client import Client

    registry = load_registry(testbed.cluster_config)

    async def burst() -> tuple[list[Client], int]:
        clients = [Client(registry) for _ in range(60)]
        answers = await asyncio.gather(*(c.probe() for c in clients))
        assert all(o.ok for outcomes in answers for o in outcomes)
        limit = clients[0].transport.max_sessions_per_cluster
        counter = "n=$(ls /tmp/corral-sessions-probe 2>/dev/null | wc -l); echo $n"
        script = (f"mkdir -p /tmp/corral-sessions-probe; f=/tmp/corral-sessions-probe/$$; : > $f; {counter}; "
                  "sleep 0.3; rm -f $f")
        results = await asyncio.gather(*(c.transport.run("alpine", script, timeout=60) for c in clients[:30]))
        return clients, max(int(r.stdout.split()[0]) for r in results) if limit else 0

    clients, most_open = asyncio.run(burst())
    probes = sum(c.transport.round_trips[cluster] for c in clients for cluster in ("borealis", "cirrus"))
    assert probes == 2  # borealis and cirrus once each, whoever asked
    assert 1 <= most_open <= clients[0].transport.max_sessions_per_cluster


@pytest.mark.parametrize(("extra", "keeps"), [
    ("", True),  # Corral's defaults: ControlMaster auto, a ControlPath, ControlPersist 600
    ("    ControlMaster no\n", False),
    ("    ControlPath none\n", False),
    ("    ControlPersist no\n", False),  # the master would stay as long as its own -N session: forever
    ("    ControlPersist yes\n", True),
])
def test_masters_are_opened_ahead_only_where_the_users_ssh_config_keeps_them(tmp_path, corral_env, extra, keeps):
    """`open_masters` reads real `ssh -G` output: the user's settings come first and win."""
    import subprocess

    from corral.ssh import keeps_masters, ssh_settings

    path = write_config(tmp_path, f"Host lab\n    HostName 127.0.0.1\n{extra}")
    transport = transport_for(path)
    settings = subprocess.run(transport.ssh_argv("lab", [], ("-G",)), capture_output=True, text=True, check=True)
    assert keeps_masters(ssh_settings(settings.stdout)) is keeps


def test_server_stop_closes_its_masters_and_lets_a_running_session_end(corral, corral_env, testbed):
    """`corral server stop` asks each ControlMaster to stop: idle ones end at once instead of holding
    their connections for ControlPersist (600 s); one with a session running ends with it."""
    import subprocess
    import time

    assert corral("check").exit_code == 0  # starts the server, which opens a master per cluster
    transport = transport_for(testbed.cluster_config)
    sockets = control_dir()
    assert len([s for s in sockets.iterdir() if s.is_socket()]) == 3
    # Its own sleep, found by its whole command line: `pgrep -f "sleep 1"` also found the testbed's other
    # sleeps (`sleep 15`), so the server could stop before the session had reached its master; the
    # session then opened a master of its own, and its socket was left (seen once in CI).
    session = subprocess.Popen(transport.ssh_argv("alpine", ["sleep 2.017; echo finished"]), stdout=subprocess.PIPE,
                               text=True)
    wait_for("the session to run on the login node", lambda: runs_somewhere("sleep", "2.017"), timeout=10,
             interval=0.02)
    assert corral("server", "stop").exit_code == 0
    left = [s for s in sockets.iterdir() if s.is_socket()]
    assert not left, [(s.name, subprocess.run(["ssh", "-o", f"ControlPath={s}", "-O", "check", "x"],  # no new
                                              capture_output=True, text=True).stderr) for s in left]  # session
    assert session.communicate(timeout=20)[0] == "finished\n"

    def masters() -> str:
        return subprocess.run(["pgrep", "-af", f"ssh .*{transport.config_file}"], capture_output=True,
                              text=True).stdout

    deadline = time.monotonic() + 10
    while masters() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not masters()


def test_a_call_made_while_its_master_opens_waits_for_it_instead_of_logging_in_beside_it(testbed, corral_env):
    """ControlMaster=auto binds its socket only after logging in: a call that did not wait for the
    master open_masters is opening would log in a second time (on 50 clusters, every cold handshake twice)."""
    from corral.ssh import open_masters

    log = testbed.paths.cluster("borealis").log / "sshd.log"
    before = log.read_text().count("Accepted publickey")
    registry = load_registry(testbed.cluster_config)
    open_masters(registry, ["borealis"])
    transport = transport_for(testbed.cluster_config)
    assert run(transport, "borealis", "echo one").stdout == "one\n"  # at once: the master is still logging in
    assert run(transport, "borealis", "echo two").stdout == "two\n"
    assert log.read_text().count("Accepted publickey") - before == 1


def test_a_remote_command_or_forced_tty_for_interactive_logins_does_not_replace_corrals_script(
        testbed, corral_env, tmp_path):
    """People set `RemoteCommand tmux attach` or `RequestTTY force` for a login node they use by hand."""
    block = host_block(testbed.cluster_config.read_text(), "alpine")
    path = write_config(tmp_path, block.replace("Host alpine\n", "Host alpine\n    RemoteCommand bash -l\n"
                                                                 "    RequestTTY force\n"))
    transport = transport_for(path)
    result = run(transport, "alpine", 'printf "%s|" "$CORRAL_TESTBED_CLUSTER"; [ -t 0 ] && echo tty || echo no-tty')
    assert result.stdout == "alpine|no-tty\n"
    chunks: list[bytes] = []
    assert asyncio.run(transport.stream("alpine", "echo streamed", chunks.append)) == 0
    assert b"".join(chunks) == b"streamed\n"
    import subprocess

    def request_tty(*options: str) -> list[str]:
        settings = subprocess.run(transport.ssh_argv("alpine", [], ("-G", *options)), capture_output=True,
                                  text=True, check=True).stdout
        return [line for line in settings.splitlines() if line.startswith("requesttty ")]

    assert request_tty() == ["requesttty false"]
    assert request_tty("-t") == ["requesttty true"]  # an interactive `corral ssh`: its -t still wins


def test_stopping_masters_removes_a_socket_whose_master_is_gone(tmp_path):
    """A control socket left by a master that died refuses connections: `server stop` removes it, so
    that no later command finds it (a live master's socket goes when it stops: the test above)."""
    import socket

    from corral.ssh import stop_masters

    dead = tmp_path / "dead"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(dead))  # bound, then closed: the file stays, and nothing listens on it
    assert dead.is_socket()
    assert stop_masters(tmp_path) == 0  # no master answered
    assert not dead.exists()


# A copy in a child process, which reports its peak memory (VmHWM, MB: its own, where ru_maxrss would count
# the forked pytest it began as) when it ends.
COPY_IN_A_CHILD = """
import asyncio, sys
from pathlib import Path
from corral.config import load_registry
from corral.ssh import SshTransport
config, how, cluster, remote, local = sys.argv[1:]
transport = SshTransport(load_registry(Path(config)), timeout=10)
if how == "fetch":
    print(asyncio.run(transport.fetch(cluster, remote, Path(local))))
else:
    asyncio.run(transport.sync(cluster, Path(local), remote))
print(int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) // 1024)
"""


def copy_in_a_child(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", COPY_IN_A_CHILD, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("how", ["fetch", "tar-stream sync"])
def test_a_large_copy_streams_past_the_engine_never_through_its_memory(testbed, corral_env, tmp_path, how):
    """A checkpoint of many GB fetched from a cluster (to carry it to another), or a workdir sent where the
    cluster has no rsync, flows from one process to the next, never through the engine's memory: 200 MB
    copied, the copying process peaks under 100 MB (it held the whole tar twice over before: ~550 MB)."""
    import uuid

    from tests.helpers import ssh_login

    remote = f".corral/test-stream/{uuid.uuid4().hex[:8]}"
    local = tmp_path / "copy"
    env = dict(corral_env)
    if how == "fetch":
        ssh_login(testbed.cluster_config, "alpine", f"mkdir -p {remote}/sub && head -c 200M /dev/zero > {remote}/sub/a")
    else:
        (local / "sub").mkdir(parents=True)
        with open(local / "sub" / "a", "wb") as f:
            f.truncate(200 * 2**20)
        env["CORRAL_REMOTE_RSYNC"] = "/nonexistent/rsync"
    child = copy_in_a_child(env, str(testbed.cluster_config), how.split()[0], "alpine", remote, str(local))
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    *answer, peak_mb = out.split()
    size = ssh_login(testbed.cluster_config, "alpine", f"stat -c %s {remote}/sub/a; rm -rf {remote}")
    assert int(size) == (local / "sub" / "a").stat().st_size == 200 * 2**20
    assert answer == (["True"] if how == "fetch" else [])
    assert int(peak_mb) < 100


def test_fetching_a_missing_directory_says_so_and_leaves_nothing(testbed, corral_env, tmp_path):
    transport = transport_for(testbed.cluster_config)
    assert asyncio.run(transport.fetch("alpine", ".corral/test-stream/never-made", tmp_path / "copy")) is False
    assert not (tmp_path / "copy").exists()


def test_a_folder_goes_straight_from_one_login_node_to_another(testbed, corral_env):
    """copy_to: a checkpoint from alpine to borealis through a pipe between two ssh sessions. The testbed's
    clusters share one home, as two clusters of one site may: a copy onto the very folder it reads from
    must leave it whole (unpacking over it would empty each file before it was read)."""
    import uuid

    from tests.helpers import ssh_login

    transport = transport_for(testbed.cluster_config)
    base = f".corral/test-copy/{uuid.uuid4().hex[:8]}"
    ssh_login(testbed.cluster_config, "alpine",
              f"mkdir -p {base}/src/sub && head -c 5M /dev/urandom > {base}/src/sub/a && echo step-7 > {base}/src/latest")
    try:
        def digest(folder: str) -> str:
            return ssh_login(testbed.cluster_config, "borealis",
                             f"cd {folder} && find . -type f | sort | xargs sha256sum")

        before = digest(f"{base}/src")
        assert asyncio.run(transport.copy_to("alpine", f"{base}/src", transport, "borealis", f"{base}/dst/")) is True
        assert digest(f"{base}/dst") == before and "./latest" in before
        # onto itself (one home for both): still whole, and nothing left beside it
        assert asyncio.run(transport.copy_to("alpine", f"{base}/src", transport, "borealis", f"{base}/src/")) is True
        assert digest(f"{base}/src") == before
        assert ssh_login(testbed.cluster_config, "alpine", f"ls {base}").split() == ["dst", "src"]
        assert asyncio.run(transport.copy_to("alpine", f"{base}/none", transport, "borealis", f"{base}/x/")) is False
        assert transport.round_trips["alpine"] == 3 and transport.round_trips["borealis"] == 3
    finally:
        ssh_login(testbed.cluster_config, "alpine", f"rm -rf {base}")


def test_a_copy_between_login_nodes_names_the_side_that_failed(testbed, corral_env, tmp_path):
    import uuid

    from corral.errors import ClusterUnreachableError

    path = write_config(tmp_path, testbed.cluster_config.read_text() + "\nHost nowhere\n    HostName 127.0.0.1\n"
                                  "    Port 1\n")
    transport = transport_for(path)
    base = f".corral/test-copy/{uuid.uuid4().hex[:8]}"
    with pytest.raises(ClusterUnreachableError, match="^nowhere: "):
        asyncio.run(transport.copy_to("nowhere", base, transport, "alpine", f"{base}/dst/"))
    run(transport, "alpine", f"mkdir -p {base} && echo x > {base}/f")
    try:
        with pytest.raises(ClusterUnreachableError, match="^nowhere: "):
            asyncio.run(transport.copy_to("alpine", base, transport, "nowhere", f"{base}/dst/"))
    finally:
        run(transport, "alpine", f"rm -rf {base}")


def test_a_copy_dies_with_the_process_that_started_it(testbed, corral_env, tmp_path):
    """A server killed (-9) in the middle of a copy: its rsync dies with it, rather than go on writing where
    the job's next holder copies the same files. Here the cluster's side of the rsync is held for 60 s."""
    import signal
    import uuid

    marker = f"test-orphan-{uuid.uuid4().hex[:8]}"
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "a.txt").write_text("a\n")
    env = {**corral_env, "CORRAL_REMOTE_RSYNC": "sleep 60 && rsync"}
    child = copy_in_a_child(env, str(testbed.cluster_config), "sync", "alpine", f".corral/{marker}/",
                            str(tmp_path / "work"))

    def local_rsyncs() -> list[int]:
        found = subprocess.run(["pgrep", "-f", f"^rsync .*alpine:.corral/{marker}"], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()]

    try:
        wait_for("the copy's rsync to start", local_rsyncs)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        wait_for("the orphaned rsync to end", lambda: not local_rsyncs(), timeout=10)
    finally:
        child.kill()
        for pid in local_rsyncs():
            os.kill(pid, signal.SIGKILL)
