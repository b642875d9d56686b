"""Removing ended jobs' env.sh from the clusters (run_files.py), on the real testbed over real SSH."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.conftest import wait_for

SECRET = "s3cret-value"


def remote(script: str, cluster: str = "alpine") -> str:
    from corral.client import Client

    return asyncio.run(Client().transport.run(cluster, script, timeout=30, check=False)).stdout


def launched(corral, *args: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """Launch a short job with a secret (on alpine unless `args` say where); its id and run
    directory, once it has ended."""
    from corral.sdk import Client

    result = corral("launch", "-d", "--json", "--secret", f"TOKEN={SECRET}", *(args or ("--infra", "slurm/alpine")),
                    "--", "echo ran", env=env)
    assert result.exit_code == 0, result.stderr
    job_id = result.json()["job_id"]
    job = Client().wait(job_id, poll=0.5, timeout=90)
    assert job.state == "SUCCEEDED", job
    from corral.state import open_store

    run_dir = open_store().views([job_id])[0].attempt.run_dir
    return job_id, run_dir


def test_an_ended_jobs_env_file_goes_in_one_round_trip_and_its_log_stays(corral, corral_env):
    """The env.sh holding the secret is there once the job ended, and gone after one pass (one round
    trip to the one cluster with such a job); the log stays, and a second pass finds nothing to do and
    sends nothing."""
    from corral import run_files
    from corral.client import Client
    from corral.state import open_store

    job_id, run_dir = launched(corral)
    assert SECRET in remote(f'cat "$HOME"/{run_dir}/env.sh')
    store, client = open_store(), Client()
    early = asyncio.run(run_files.remove_env_files(client, store, time.time()))  # ended within GRACE: kept
    assert early.removed == {} and early.errors == {}
    before = dict(client.transport.round_trips)
    report = asyncio.run(run_files.remove_env_files(client, store, time.time(), grace=0))
    assert report.removed.get("alpine", 0) >= 1 and report.errors == {}
    trips = {c: n - before.get(c, 0) for c, n in client.transport.round_trips.items() if n - before.get(c, 0)}
    assert trips == {cluster: 1 for cluster in report.removed}  # one per cluster, whatever the count
    left = remote(f'ls "$HOME"/{run_dir}').split()
    assert "env.sh" not in left and {"log.txt", "job.sbatch"} <= set(left)
    assert store.views([job_id])[0].attempt.run_dir_state == "env-removed"
    assert "ran" in corral("logs", "--no-follow", job_id).stdout
    before = dict(client.transport.round_trips)
    again = asyncio.run(run_files.remove_env_files(client, store, time.time(), grace=0))
    assert again.removed == {} and dict(client.transport.round_trips) == before


def test_the_server_removes_them_by_itself(corral, corral_env):
    """Wired into the server's loop (its chores): with a 1 s interval and no grace, an ended job's
    env.sh goes without anyone asking, and the server's log says so."""
    corral_env.update(CORRAL_RUN_FILES_INTERVAL="1", CORRAL_RUN_FILES_GRACE="0")
    job_id, run_dir = launched(corral)
    log = Path(corral_env["CORRAL_HOME"]) / "controller.log"
    said = "removed env.sh from 1 ended jobs' run directories on alpine"
    wait_for("the server to say it removed env.sh", lambda: said in log.read_text(), timeout=60, interval=0.5)
    assert remote(f'[ -e "$HOME"/{run_dir}/env.sh ] || echo gone; [ -e "$HOME"/{run_dir}/log.txt ] && echo log-kept'
                  ).split() == ["gone", "log-kept"]


def test_a_user_the_pass_cannot_act_as_holds_up_no_one_else_and_is_tried_next_pass(tmp_path):
    """In batches of `batch` directories; alice's failure is reported and left for the next pass,
    while bob's directories all go in this one."""
    from corral import run_files
    from corral.errors import CorralError
    from corral.infra.base import RemovesRunFiles
    from corral.state import Store
    from corral.state.models import AttemptRow, JobRow

    class Removing(RemovesRunFiles):
        """Removes env files (the pass's only call), or fails as a user it cannot act as."""

        def __init__(self, fails: bool):
            self.fails = fails

        async def remove_env_files(self, ended) -> None:
            if self.fails:
                raise CorralError("no account for alice on alpine")
            calls.append(sorted(e.run_dir for e in ended))

        async def remove_run_dirs(self, ended) -> None:
            raise AssertionError("only env files are asked for")

    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    jobs, attempts = [], []
    for number, owner in enumerate(["alice", "bob", "bob", "bob"]):
        token = f"{number:012x}"
        jobs.append(JobRow(id=f"c-{number}", name="t", task_json="{}", created_at=1.0, owner=owner))
        attempts.append(AttemptRow(token=token, job_id=f"c-{number}", cluster="alpine", partition="gpu",
                                   state="SUCCEEDED", ended_at=10.0, run_dir=f".corral/runs/{token}", log_path="x"))
    store.add_jobs(jobs, attempts)
    calls: list = []

    class Stub:
        class registry:  # noqa: N801 - what the pass reads of a client's registry
            @staticmethod
            def names() -> list[str]:
                return ["alpine"]

        def infra(self, cluster: str, owner: str = "") -> Removing:
            return Removing(fails=owner == "alice")

    report = asyncio.run(run_files.remove_env_files(Stub(), store, 1000.0, batch=2))
    assert report.removed == {"alpine": 3} and "no account for alice" in report.errors["alpine"]
    assert sorted(d for call in calls for d in call) == [f".corral/runs/{n:012x}" for n in (1, 2, 3)]
    assert all(len(call) <= 2 for call in calls)
    again = asyncio.run(run_files.remove_env_files(Stub(), store, 1000.0, batch=2))
    assert again.removed == {} and list(again.errors) == ["alpine"]  # alice's, tried again


def test_on_an_ssh_pool_each_ranks_env_file_goes_from_its_machine(corral, pool_env, monkeypatch):
    """A two-node task on the testbed's machines: each rank's env.sh, in its own run directory on its
    own machine, goes in one round trip per machine; the logs stay."""
    from corral import run_files
    from corral.client import Client
    from corral.state import open_store

    monkeypatch.setenv("CORRAL_SLURM_CONFIG", pool_env["CORRAL_SLURM_CONFIG"])
    job_id, _ = launched(corral, "--gpus", "A100:4", "--num-nodes", "2", env=pool_env)
    store = open_store()
    attempt = store.views([job_id])[0].attempt
    hosts, token = attempt.handle.split("/")
    ranks = [Path(f"/home/corral-test/.corral/runs/{token}.{rank}") for rank in (0, 1)]  # the machines share it
    assert attempt.cluster == "lab" and all(SECRET in (rank / "env.sh").read_text() for rank in ranks)
    client = Client()
    before = dict(client.transport.round_trips)
    report = asyncio.run(run_files.remove_env_files(client, store, time.time(), grace=0))
    assert report.removed.get("lab") == 1 and report.errors == {}
    trips = {c: n - before.get(c, 0) for c, n in client.transport.round_trips.items() if n - before.get(c, 0)}
    assert {host: trips.get(host) for host in hosts.split(",")} == {host: 1 for host in hosts.split(",")}
    assert not any((rank / "env.sh").exists() for rank in ranks)
    assert all((rank / "log.txt").exists() for rank in ranks)
    whole = asyncio.run(run_files.remove_run_dirs(client, store, time.time(), keep_days=0, grace=0))
    assert whole.removed.get("lab") == 1 and not any(rank.exists() for rank in ranks)


def test_with_keep_days_the_server_removes_old_run_directories_whole_and_logs_say_so(corral, corral_env):
    """`run_dirs: {keep_days: 0}` in the server's config.yaml: an ended job's run directory goes
    whole, and `corral logs` says why there is no log rather than printing nothing."""
    from pathlib import Path

    home = Path(corral_env["CORRAL_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("run_dirs: {keep_days: 0}\n")
    corral_env.update(CORRAL_RUN_FILES_INTERVAL="1", CORRAL_RUN_FILES_GRACE="0")
    job_id, run_dir = launched(corral)
    said = "removed the whole of 1 ended jobs' run directories on alpine"
    wait_for("the server to say it removed the run directory", lambda: said in (home / "controller.log").read_text(),
             timeout=60, interval=0.5)
    assert remote(f'[ -e "$HOME"/{run_dir} ] || echo gone').split() == ["gone"]
    shown = corral("logs", "--no-follow", job_id)
    assert shown.exit_code == 66, shown.stderr
    assert f"{job_id} ended, 0 days ago; its run directory on alpine, log included, was removed since" in shown.stderr


def test_an_ended_job_groups_host_files_go_in_one_round_trip_per_cluster(corral, corral_env, tmp_path):
    """The folder by which a job group's tasks found each other (CORRAL_JOBGROUP_HOSTS, one per round)
    stays while any task may still read it, and goes once every task has ended: one round trip to the
    cluster they ran on; a second pass finds nothing and sends nothing."""
    from corral import run_files
    from corral.client import Client
    from corral.sdk import Client as Sdk
    from corral.state import open_store

    (tmp_path / "group.yaml").write_text("name: hosts\nexecution: parallel\n---\nname: a\nresources: {infra: "
                                         "slurm/alpine}\nrun: ls \"$CORRAL_JOBGROUP_HOSTS\"\n---\nname: b\n"
                                         "resources: {infra: slurm/alpine}\nrun: 'true'\n")
    launched = corral("jobs", "launch", "-d", "--json", "group.yaml", cwd=tmp_path)
    assert launched.exit_code == 0, launched.stderr
    group = launched.json()["job_id"]
    folder = Path(f"/home/corral-test/.corral/groups/{group}")  # the testbed's clusters share this home
    sdk = Sdk()
    tasks = [m.job_id for m in sdk.managed_jobs(all=True)[0] if m.pipeline and m.pipeline.id == group]
    assert len(tasks) == 2
    for task in tasks:
        assert sdk.managed_wait(task, poll=0.5, timeout=120).state == "SUCCEEDED"
    assert folder.is_dir() and sorted(p.name for r in folder.iterdir() for p in r.iterdir()) == ["a-0", "b-0"]
    store, client = open_store(), Client()
    early = asyncio.run(run_files.remove_group_dirs(client, store, time.time()))  # ended within GRACE: kept
    assert early.removed == {} and folder.is_dir()
    before = dict(client.transport.round_trips)
    report = asyncio.run(run_files.remove_group_dirs(client, store, time.time(), grace=0))
    assert report.removed == {"alpine": 1} and report.errors == {}
    trips = {c: n - before.get(c, 0) for c, n in client.transport.round_trips.items() if n - before.get(c, 0)}
    assert trips == {"alpine": 1} and not folder.exists()
    before = dict(client.transport.round_trips)
    again = asyncio.run(run_files.remove_group_dirs(client, store, time.time(), grace=0))
    assert again.removed == {} and dict(client.transport.round_trips) == before


def launched_from(corral, folder: Path) -> str:
    """A short job on alpine with `folder` as its workdir, once it has ended; its cache's key there."""
    import hashlib
    import socket

    from corral.sdk import Client

    folder.mkdir(exist_ok=True)
    (folder / "note.txt").write_text("from the workdir\n")
    result = corral("launch", "-d", "--json", "--workdir", str(folder), "--infra", "slurm/alpine", "--", "cat note.txt")
    assert result.exit_code == 0, result.stderr
    assert Client().wait(result.json()["job_id"], poll=0.5, timeout=90).state == "SUCCEEDED"
    return hashlib.sha256(f"{socket.gethostname()}:{folder}".encode()).hexdigest()[:16]


def test_a_workdir_cache_unused_for_keep_days_goes_in_one_round_trip_per_place(corral, corral_env, tmp_path):
    """The store names where attempts ran (alpine, as this user); the prune visits each once. A
    launch's cache is fresh and stays; made 15 days old, it goes, and with it nothing else."""
    from corral import run_files
    from corral.client import Client
    from corral.state import open_store

    key = launched_from(corral, tmp_path / "work")
    store, client = open_store(), Client()
    assert store.run_places() == [("alpine", "")]
    before = dict(client.transport.round_trips)
    report = asyncio.run(run_files.prune_workdir_caches(client, store, run_files.cache_keep_days()))
    assert (report.removed, report.errors) == ({}, {})
    trips = {c: n - before.get(c, 0) for c, n in client.transport.round_trips.items() if n - before.get(c, 0)}
    assert trips == {"alpine": 1}
    remote(f'touch -d "15 days ago" "$HOME"/.corral/cache/{key}.used')
    report = asyncio.run(run_files.prune_workdir_caches(client, store, run_files.cache_keep_days()))
    assert (report.removed, report.errors) == ({"alpine": 1}, {})
    assert remote(f'ls -d "$HOME"/.corral/cache/{key}* 2>/dev/null | wc -l').strip() == "0"


def test_the_server_prunes_workdir_caches_by_itself(corral, corral_env, tmp_path):
    """Wired into the server's chores (once a day; here every second): a cache whose last use is
    older than `workdir_cache: {keep_days: 2}` goes, and the server's log says so."""
    home = Path(corral_env["CORRAL_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("workdir_cache: {keep_days: 2}\n")
    corral_env.update(CORRAL_RUN_FILES_INTERVAL="1", CORRAL_CACHES_INTERVAL="1")
    key = launched_from(corral, tmp_path / "work")
    remote(f'touch -d "3 days ago" "$HOME"/.corral/cache/{key}.used')
    said = "removed 1 workdir caches unused for 2 days on alpine"
    wait_for("the server to say it pruned the cache", lambda: said in (home / "controller.log").read_text(),
             timeout=60, interval=0.5)
    assert remote(f'ls -d "$HOME"/.corral/cache/{key}* 2>/dev/null | wc -l').strip() == "0"
