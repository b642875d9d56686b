"""Submit as user: a team server whose members' jobs reach Slurm as their own Unix accounts, on the
real testbed (corral-alice and corral-bob on every cluster). alpine reaches each member with the
server's key for them (`submit_as: ssh`), borealis through the test user with sudo and the shipped
docs/sudoers.example (`submit_as: sudo`), cirrus lets the test user submit for everyone (`service`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from corral.sdk import ApiError, Client
from tests.conftest import wait_for
from tests.controller.test_team import add_user
from tests.helpers import free_port
from tests.helpers import as_member, ssh_login

ALICE, BOB = "corral-alice", "corral-bob"
SETTINGS = "clusters:\n  alpine: {submit_as: ssh}\n  borealis: {submit_as: sudo}\n  cirrus: {submit_as: service}\n"


def _clean_members(testbed) -> None:
    """Cancel the members' jobs (as root: Slurm's admin) and take back what the tests gave them."""
    for spec in testbed.clusters:
        for user in (ALICE, BOB):
            subprocess.run(["scancel", "-u", user], env=testbed.slurm_env(spec.name), capture_output=True)
    for user in (ALICE, BOB):
        home = Path("/home") / user
        subprocess.run(["rm", "-rf", str(home / ".ssh" / "authorized_keys"), str(home / ".corral")])


@pytest.fixture
def members(testbed):
    _clean_members(testbed)
    yield
    _clean_members(testbed)


@pytest.fixture
def team_as_users(corral, corral_env, fresh_postgres, clean_queues, members):
    home = Path(corral_env["CORRAL_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(SETTINGS)
    port = free_port()
    started = corral("server", "start", "--host", "127.0.0.1", "--port", str(port), "--db", fresh_postgres)
    assert started.exit_code == 0, started.stderr
    yield f"http://127.0.0.1:{port}"
    corral("server", "stop")


def authorize(testbed, user: str, cluster: str, client: Client) -> None:
    """What a member does once per cluster: add the server's key for them to their authorized_keys."""
    key = client.me()["ssh_public_key"]
    added = as_member(testbed, user, cluster, "umask 077; mkdir -p ~/.ssh && cat >> ~/.ssh/authorized_keys",
                      stdin=key + "\n")
    assert added.returncode == 0, added.stderr


def slurm_user(testbed, cluster: str, job_id: str) -> str:
    return ssh_login(testbed.cluster_config, cluster, f"squeue -h -j {job_id} -o %u").strip()


def test_members_jobs_run_as_their_own_accounts(corral, corral_env, team_as_users, testbed):
    url = team_as_users
    alice_token = add_user(corral, "alice", "--unix-user", f"alpine={ALICE}", "--unix-user", f"borealis={ALICE}")
    bob_token = add_user(corral, "bob", "--unix-user", f"alpine={BOB}", "--unix-user", f"borealis={BOB}")
    alice, bob = Client(url, alice_token), Client(url, bob_token)
    key = alice.me()["ssh_public_key"]
    assert key.startswith("ssh-ed25519 ") and key.endswith("corral-team:alice")
    assert bob.me()["ssh_public_key"] != key

    # Before alice authorizes the server's key, alpine refuses it, and says what to do.
    with pytest.raises(ApiError) as refused:
        alice.launch(command="true", infra="slurm/alpine/cpu", cpus="1")
    assert "corral api ssh-key" in str(refused.value), str(refused.value)
    alice_env = {**corral_env, "CORRAL_API_URL": url, "CORRAL_API_TOKEN": alice_token}
    printed = corral("api", "ssh-key", env=alice_env)
    assert printed.exit_code == 0 and printed.stdout.strip() == key
    authorize(testbed, ALICE, "alpine", alice)
    authorize(testbed, BOB, "alpine", bob)

    run = "id -un; sleep 300"
    on_alpine = alice.launch(command=run, infra="slurm/alpine/cpu", cpus="1", name="alice-ssh")
    on_borealis = alice.launch(command=run, infra="slurm/borealis", cpus="1", name="alice-sudo")
    bobs = bob.launch(command=run, infra="slurm/borealis", cpus="1", name="bob-sudo")
    jobs = {name: (launched.job_ids[0], launched.tasks[0][0]) for name, launched in
            (("alice-ssh", on_alpine), ("alice-sudo", on_borealis), ("bob-sudo", bobs))}

    # Slurm names each person's own account, whichever way the server reached it.
    assert slurm_user(testbed, "alpine", jobs["alice-ssh"][1].slurm_job_id) == ALICE
    assert slurm_user(testbed, "borealis", jobs["alice-sudo"][1].slurm_job_id) == ALICE
    assert slurm_user(testbed, "borealis", jobs["bob-sudo"][1].slurm_job_id) == BOB

    # The server's one status query (through the test user) sees everyone's jobs run.
    def running() -> bool:
        states = {job.job_id: job.state for client in (alice, bob) for job in client.queue().jobs}
        return all(states.get(job_id) == "RUNNING" for job_id, _ in jobs.values())
    wait_for("every job to run", running, timeout=90, interval=1)
    # The admin's table says whose each job is; a member's own table has no need to.
    admin_table = corral("queue").stdout
    assert "OWNER" in admin_table and " alice " in admin_table and " bob " in admin_table, admin_table
    assert "OWNER" not in corral("queue", env=alice_env).stdout

    # Their files are theirs: run dirs are private (700), and each task ran as its owner (its output,
    # read back through the server as that owner, says who it was).
    for name, cluster, user, client in (("alice-ssh", "alpine", ALICE, alice), ("alice-sudo", "borealis", ALICE, alice),
                                        ("bob-sudo", "borealis", BOB, bob)):
        listed = as_member(testbed, user, cluster, "stat -c '%U %a' ~/.corral/runs/*").stdout.split("\n")
        assert listed[0].split() == [user, "700"], listed
        output = wait_for(f"{name}'s output", lambda: b"".join(client.logs(jobs[name][0])).strip(), timeout=60)
        assert output == user.encode(), output

    # sacct (borealis keeps accounting) names them too.
    bob_slurm_id = jobs["bob-sudo"][1].slurm_job_id
    record = wait_for("sacct to name bob", lambda: ssh_login(
        testbed.cluster_config, "borealis", f"sacct -a -n -X -P -j {bob_slurm_id} -o User").strip(), timeout=60)
    assert record == BOB

    # alice can neither read bob's run dir nor cancel his job: not through Corral, not directly.
    peek = as_member(testbed, ALICE, "borealis", f"ls ~{BOB}/.corral/runs")
    assert peek.returncode != 0 and "Permission denied" in peek.stderr
    direct = as_member(testbed, ALICE, "borealis", f"scancel {bob_slurm_id}")
    assert "Access/permission denied" in direct.stderr, direct.stderr
    with pytest.raises(ApiError) as hidden:
        alice.cancel([jobs["bob-sudo"][0]])
    assert hidden.value.status == 404
    assert slurm_user(testbed, "borealis", bob_slurm_id) == BOB  # still there

    # bob cancels his own, as himself (through sudo): Slurm takes it.
    [outcome] = bob.cancel([jobs["bob-sudo"][0]])
    assert outcome.cancelled, outcome
    wait_for("bob's job to leave the queue", lambda: ssh_login(
        testbed.cluster_config, "borealis", f"squeue -h -j {bob_slurm_id} -o %T").strip() in ("", "COMPLETING"),
        timeout=60)


def test_a_member_without_an_account_is_refused_and_placed_elsewhere(corral, corral_env, team_as_users, testbed):
    url = team_as_users
    token = add_user(corral, "carol", "--unix-user", f"alpine={ALICE}")  # no account on borealis
    carol_env = {**corral_env, "CORRAL_API_URL": url, "CORRAL_API_TOKEN": token}
    pinned = corral("launch", "-d", "--infra", "slurm/borealis", "--", "true", env=carol_env)
    assert pinned.exit_code not in (0, 70) and "Traceback" not in pinned.stderr, pinned.stderr
    assert "carol has no account on borealis" in pinned.stderr, pinned.stderr
    assert "corral users set carol --unix-user borealis=" in pinned.stderr
    plan = corral("launch", "--dryrun", "--cpus", "1", "--", "true", env=carol_env)
    assert plan.exit_code == 0, plan.stderr
    assert "carol has no account on borealis" in plan.stdout, plan.stdout
    # An admin maps one: the same token now reaches borealis.
    changed = corral("users", "set", "carol", "--unix-user", f"alpine={ALICE}", "--unix-user", f"borealis={ALICE}")
    assert changed.exit_code == 0, changed.stderr
    assert "borealis=corral-alice" in changed.stdout
    again = corral("launch", "--dryrun", "--infra", "slurm/borealis", "--", "true", env=carol_env)
    assert again.exit_code == 0 and "no account" not in again.stdout, again.stderr + again.stdout
    # A setting for a cluster the server does not have is refused when the server starts.
    home = Path(corral_env["CORRAL_HOME"]).parent / "typo-home"
    home.mkdir()
    (home / "config.yaml").write_text("clusters:\n  borelais: {submit_as: sudo}\n")
    typo = corral("server", "start", "--host", "127.0.0.1", "--port", str(free_port()),
                  env={**corral_env, "CORRAL_HOME": str(home)})
    assert typo.exit_code == 78 and "'borelais' is not a cluster of this server" in typo.stderr, typo.stderr


def test_one_status_query_per_cluster_for_every_members_jobs(testbed, corral_env, clean_queues, members,
                                                             fresh_postgres):
    """In process: two members' jobs on one cluster (one through sudo, one with the server's key) are
    refreshed with one round trip to it, through the service account."""
    from corral import accounts
    from corral.client import Client as EngineClient
    from corral.controller.auth import Role, add_user as register
    from corral.launch import Launcher
    from corral.state import open_store
    from corral.task import parse_task
    from corral.tracker import Tracker

    store = open_store(fresh_postgres)
    for name, user in (("alice", ALICE), ("bob", BOB)):
        register(store, name, Role.USER, {"borealis": user, "alpine": user})
    settings = accounts.SubmitSettings(accounts.SubmitMode.SSH, {"borealis": accounts.SubmitMode.SUDO})
    team = accounts.TeamAccounts(store, settings)
    row = store.user("alice")
    assert row is not None and row.ssh_public_key
    home = Path("/home") / ALICE / ".ssh"  # alice authorizes the server's key for her on alpine
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "authorized_keys").write_text(row.ssh_public_key + "\n")
    (home / "authorized_keys").chmod(0o600)
    subprocess.run(["chown", "-R", f"{ALICE}:{ALICE}", str(home)], check=True)

    async def scenario() -> tuple[dict[str, int], list[tuple[str, str]]]:
        client = EngineClient(accounts=team)
        for owner, infra in (("alice", "slurm/borealis"), ("bob", "slurm/borealis"), ("alice", "slurm/alpine")):
            task = parse_task({"resources": {"cpus": 1, "infra": infra}, "run": "sleep 300"}, "test")
            await Launcher(client, store, owner=owner).launch(task, "test")
        report = await Tracker(EngineClient(accounts=team), store).refresh()
        return report.round_trips, [(a.handle or "", a.cluster) for a in store.active_attempts()]

    trips, handles = asyncio.run(scenario())
    assert trips == {"borealis": 1, "alpine": 1}, trips
    assert len(handles) == 3
    owners = {ssh_login(testbed.cluster_config, cluster, f"squeue -h -j {handle} -o %u").strip()
              for handle, cluster in handles}
    assert owners == {ALICE, BOB}


def test_managed_jobs_and_dev_allocations_act_as_their_owner(corral, team_as_users, testbed, tmp_path):
    """The controller's attempts, and a dev allocation's holder and exec, run as the member: bob's
    managed job through sudo, with its workdir copied as him; alice's allocation with the server's key."""
    url = team_as_users
    alice = Client(url, add_user(corral, "alice", "--unix-user", f"alpine={ALICE}", "--unix-user", f"borealis={ALICE}"))
    bob = Client(url, add_user(corral, "bob", "--unix-user", f"borealis={BOB}"))
    authorize(testbed, ALICE, "alpine", alice)
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.txt").write_text("from bob's laptop\n")
    [managed] = bob.managed_launch({"workdir": str(work), "resources": {"cpus": 1, "infra": "slurm/borealis"},
                                    "run": "id -un; cat hello.txt; sleep 300"}, name="bobs-managed")
    attempt = wait_for("the controller to submit bob's managed job", lambda: bob.managed_job(managed)["slurm_job_id"],
                       timeout=60)
    assert slurm_user(testbed, "borealis", attempt) == BOB
    output = wait_for("its output, read as bob", lambda: b"".join(bob.managed_logs(managed, 1)).count(b"\n") >= 2
                      and b"".join(bob.managed_logs(managed, 1)), timeout=60)
    assert output.split() == [BOB.encode(), b"from", b"bob's", b"laptop"], output

    box = alice.dev_launch("box", infra="slurm/alpine/cpu", cpus="1")
    assert slurm_user(testbed, "alpine", box["slurm_job_id"]) == ALICE
    seen: list[bytes] = []
    _job, code = alice.dev_exec("box", command="id -un", on_output=seen.append)
    assert code == 0 and b"".join(seen).strip() == ALICE.encode()
    assert alice.dev_down("box")
    bob.managed_cancel([managed])
    wait_for("bob's managed job to be cancelled as him", lambda: ssh_login(
        testbed.cluster_config, "borealis", f"squeue -h -j {attempt} -o %T").strip() in ("", "COMPLETING"),
        timeout=60)


def test_a_pool_is_shared_by_members_only_where_the_server_says_so(corral, pool_env, fresh_postgres, members):
    """An SSH pool on a team server runs every member's tasks as the one account the server reaches its
    machines with: their GPU claims and queue live in its home (a member's own account would claim GPUs
    the others cannot see). So members are refused there, with what an admin can do, until `submit_as`
    is `service` for the pool; `ssh` or `sudo` named for it stops the server from starting. Allowed,
    two members' tasks share one set of claims: they take different machines, and a third waits."""
    home = Path(pool_env["CORRAL_HOME"])
    pool = json.loads((home / "config.yaml").read_text())

    def serve(**team: object) -> tuple[int, str, str]:
        (home / "config.yaml").write_text(json.dumps({**pool, **team}))
        port = free_port()
        started = corral("server", "start", "--host", "127.0.0.1", "--port", str(port), "--db", fresh_postgres,
                         env=pool_env)
        return started.exit_code, started.stdout + started.stderr, f"http://127.0.0.1:{port}"

    code, said, url = serve(submit_as="ssh")
    assert code == 0, said
    alice_token = add_user(lambda *a: corral(*a, env=pool_env), "alice", "--unix-user", f"alpine={ALICE}")
    alice = Client(url, alice_token)
    with pytest.raises(ApiError) as refused:
        alice.launch(command="true", infra="ssh/lab")
    assert refused.value.status == 400, refused.value  # as any pinned place that cannot run it
    assert "lab is an SSH pool" in str(refused.value) and "`clusters: {lab: {submit_as: service}}`" in str(
        refused.value), str(refused.value)
    alice_env = {**pool_env, "CORRAL_API_URL": url, "CORRAL_API_TOKEN": alice_token}
    plan = corral("launch", "--dryrun", "--gpus", "A100:1", "--", "true", env=alice_env)
    assert plan.exit_code == 69 and "lab is an SSH pool" in plan.stdout, plan.stdout + plan.stderr  # nowhere else
    mapped = corral("users", "set", "alice", "--unix-user", f"lab={ALICE}", env=pool_env)
    assert mapped.exit_code == 65 and "it takes no mapping" in mapped.stderr, mapped.stderr
    assert corral("server", "stop", env=pool_env).exit_code == 0

    code, said, _ = serve(clusters={"lab": {"submit_as": "sudo"}})
    assert code == 78 and "clusters.lab.submit_as: sudo" in said and "only `service` can be set" in said, said

    code, said, url = serve(clusters={"lab": {"submit_as": "service"}})
    assert code == 0, said
    alice = Client(url, alice_token)  # the same user and token: the store is the same
    bob = Client(url, add_user(lambda *a: corral(*a, env=pool_env), "bob"))
    run = "id -un; sleep 300"
    first = alice.launch(command=run, infra="ssh/lab", gpus="A100:4", name="alice-a100")
    second = bob.launch(command=run, infra="ssh/lab", gpus="A100:4", name="bob-a100")
    machines = sorted(launched.tasks[0][0].slurm_job_id.split("/")[0] for launched in (first, second))
    assert machines == ["lab1", "lab2"], machines  # bob's claim saw alice's
    third = alice.launch(command="true", infra="ssh/lab", gpus="A100:4", name="alice-waits")
    waiting = wait_for("the third task's reason", lambda: next(
        j for j in alice.queue().jobs if j.job_id == third.job_ids[0]).reason, timeout=60)
    assert waiting.startswith("Resources (waiting on lab"), waiting
    output = wait_for("alice's output", lambda: b"".join(alice.logs(first.job_ids[0])).strip(), timeout=60)
    assert output == b"corral-test"  # the pool's account, not hers
    alice.cancel([third.job_ids[0], first.job_ids[0]])
    bob.cancel([second.job_ids[0]])
    assert corral("server", "stop", env=pool_env).exit_code == 0
