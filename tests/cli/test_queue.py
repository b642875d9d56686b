"""`corral queue` over a long history: a page of what matters, a line for the rest, sweeps as one row.
Runs the real CLI in-process against a store with thousands of ended jobs; the clusters refuse
connections at once, so the refresh is cheap and the table is what is measured."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from corral.state import Store
from corral.state.models import AttemptRow, JobRow
from tests.helpers import run_cli


def seed(home, jobs: int, name: str = "job{i}") -> None:
    store = Store(f"sqlite:///{home / 'state.db'}")
    now = time.time() - 3600
    rows = [JobRow(id=f"c-{i:012x}", name=name.replace("{i}", str(i)), task_json="{}", created_at=now + i, num_jobs=1)
            for i in range(jobs)]
    sweep = [JobRow(id=f"c-5{i:011x}", name="sweep", task_json="{}", created_at=now + jobs + 10, job_rank=i,
                    num_jobs=30, sweep_id="c-500000000000") for i in range(30)]
    attempts = [AttemptRow(token=f"t{r.id}", job_id=r.id, number=1, cluster="alpine", partition="gpu",
                           state="SUCCEEDED" if not r.sweep_id or r.job_rank < 20 else "FAILED", created_at=r.created_at,
                           run_dir="r", log_path="l", ended_at=r.created_at + 1) for r in rows + sweep]
    store.add_jobs(rows + sweep, attempts)


def test_queue_shows_a_page_and_says_how_many_more(refusing_clusters):
    home = refusing_clusters / "home"
    home.mkdir(mode=0o700)
    seed(home, 3000)
    code, out, err = run_cli(["queue"])
    assert code == 0, err
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0].split()[:2] == ["ID", "NAME"] and len(lines) == 1 + 20
    assert "SLURM ID" in lines[0]  # every row on Slurm (a pool's among them makes it INFRA ID: tests/cli/test_pools.py)
    assert lines[1].startswith("c-500000000000 (sweep)") and "sweep ×30" in lines[1]
    assert "20 SUCCEEDED" in lines[1] and "10 FAILED" in lines[1]
    assert lines[2].split()[0] == f"c-{2999:012x}"  # newest first
    assert "2981 more ended jobs (a sweep counts once)" in err  # 3000 jobs and 1 sweep, 20 of them shown
    code, out, _ = run_cli(["queue", "--expand", "--limit", "5", "--page", "2"])
    assert [line.split()[0] for line in out.splitlines()[1:]] == [f"c-5{i:011x}" for i in range(24, 19, -1)]
    code, out, _ = run_cli(["queue", "--json", "--limit", "3"])
    assert [row["job_id"] for row in json.loads(out)] == [f"c-5{i:011x}" for i in range(29, 26, -1)]
    code, out, _ = run_cli(["queue", "--all", "--json"])
    assert len(json.loads(out)) == 3030
    code, _, err = run_cli(["queue", "--since", "yesterday-ish"])
    assert code == 2 and "--since 'yesterday-ish': give a duration" in err
    for before_1970 in ("99999d", "0001-01-01"):  # everything (the server had refused a negative time)
        code, out, err = run_cli(["queue", "--since", before_1970, "--json", "--limit", "3"])
        assert code == 0 and len(json.loads(out)) == 3, err
    code, out, err = run_cli(["queue", "--since", "9999-12-31", "--json"])  # nothing has ended since
    assert code == 0 and json.loads(out) == [], err
    # `sky queue -s`: the live jobs only, and no line about the ended ones
    code, out, err = run_cli(["queue", "-s"])
    assert code == 0 and out.strip() == "No live jobs." and "more ended" not in err, out  # was "on this page"
    store = Store(f"sqlite:///{home / 'state.db'}")
    store.add_jobs([JobRow(id="c-live00000000", name="live", task_json="{}", created_at=time.time() - 7200, num_jobs=1)],
                   [AttemptRow(token="tlive", job_id="c-live00000000", number=1, cluster="alpine", partition="gpu",
                               state="PENDING", created_at=time.time() - 7200, run_dir="r", log_path="l", handle="9")])
    code, out, err = run_cli(["queue", "-s"])
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == ["c-live00000000"], out
    assert "more ended" not in err
    code, out, _ = run_cli(["queue", "--skip-finished", "--json"])
    assert [row["job_id"] for row in json.loads(out)] == ["c-live00000000"]


@pytest.mark.parametrize("argv", [["gpus"], ["check"], ["--help"], ["queue", "--help"]])
def test_tables_load_neither_the_engine_nor_sqlalchemy_nor_pydantic(refusing_clusters, argv):
    """The `gpus` table used to import the launcher, the store, SQLAlchemy and pydantic just to render."""
    probe = ("import sys\n"
             "from corral.cli.main import main\n"
             f"sys.argv = ['corral', *{argv!r}]\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "heavy = [m for m in ('sqlalchemy', 'pydantic', 'fastapi', 'corral.launch', 'corral.state') "
             "if m in sys.modules]\n"
             "print('HEAVY', heavy, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in proc.stderr, proc.stderr


def test_queue_narrowed_by_state_cluster_and_name_as_squeue_does(refusing_clusters):
    home = refusing_clusters / "home"
    home.mkdir(mode=0o700)
    seed(home, 50)  # 50 jobs that succeeded on alpine, and a sweep of 30: 20 succeeded, 10 failed

    def ids(out: str) -> list[str]:
        return [line.split()[0] for line in out.splitlines()[1:]]

    code, out, err = run_cli(["queue", "-t", "F"])  # Slurm's short form; one row per job, newest first
    assert code == 0 and ids(out) == [f"c-5{i:011x}" for i in range(29, 19, -1)], err
    code, out, err = run_cli(["queue", "--state", "completed", "--limit", "5"])
    assert code == 0 and len(ids(out)) == 5 and "65 more matching jobs: `--page 2`" in err, err
    code, out, err = run_cli(["queue", "-t", "PD,R"])
    assert (code, out.strip()) == (0, "No jobs match."), err
    code, out, _ = run_cli(["queue", "--name", "job4", "--json"])
    assert sorted(row["name"] for row in json.loads(out)) == ["job4", *(f"job4{i}" for i in range(10))]
    code, out, _ = run_cli(["queue", "--infra", "slurm/borealis", "--json"])
    assert (code, json.loads(out)) == (0, [])
    code, _, err = run_cli(["queue", "-t", "bogus"])
    assert code == 65 and "unknown job state 'bogus': use live, one of" in err, err
    for argv, message in ((["-s", "-t", "F"], "-s is --state live"), (["--infra", "slurm/alpine/gpu"], "not a partition"),
                          (["--all", "-t", "F"], "--all streams every job")):
        code, _, err = run_cli(["queue", *argv])
        assert code == 2 and message in err, (argv, err)


def test_queue_of_a_sweeps_id_lists_its_jobs_and_an_unknown_id_says_so(refusing_clusters):
    """The id a sweep's row shows, given back to `queue`, lists that sweep's jobs (filters narrow
    them); a single job's id lists that job; an id that is neither a job nor an allocation is exit 66."""
    home = refusing_clusters / "home"
    home.mkdir(mode=0o700)
    seed(home, 5)

    def ids(out: str) -> list[str]:
        return [line.split()[0] for line in out.splitlines()[1:]]

    code, out, err = run_cli(["queue", "c-500000000000", "--limit", "100"])
    assert code == 0 and ids(out) == [f"c-5{i:011x}" for i in range(29, -1, -1)], err
    code, out, err = run_cli(["queue", "c-500000000000", "-t", "FAILED", "--json"])
    assert code == 0 and [row["job_id"] for row in json.loads(out)] == [f"c-5{i:011x}" for i in range(29, 19, -1)]
    code, out, err = run_cli(["queue", "c-500000000000"])  # a page, and a line for the rest
    assert code == 0 and len(ids(out)) == 20 and "10 more matching jobs: `--page 2`" in err, err
    code, out, err = run_cli(["queue", f"c-{3:012x}"])
    assert code == 0 and ids(out) == [f"c-{3:012x}"], err
    code, _, err = run_cli(["queue", "c-0000000000ff"])
    assert code == 66 and "no job or sweep 'c-0000000000ff', and no dev allocation of that name" in err, err


def test_jobs_queue_narrows_the_ended_managed_jobs_by_since_as_queue_does(refusing_clusters):
    from corral.state.models import ManagedState

    home = refusing_clusters / "home"
    home.mkdir(mode=0o700)
    store = Store(f"sqlite:///{home / 'state.db'}")
    now = time.time()
    store.add_managed_jobs([{"id": f"c-{i:012x}", "name": f"m{i}", "task_json": "{}", "created_at": now - hours * 3600,
                             "job_rank": 0, "num_jobs": 1, "sweep_id": None, "submitter": None, "allocation": None,
                             "owner": ""} for i, hours in enumerate([3, 2, 0.5, 0.1])])
    store.set_managed_many([(f"c-{i:012x}", ManagedState.SUCCEEDED, None, {}) for i in range(3)])  # 3 stays live
    code, out, err = run_cli(["jobs", "queue", "--since", "1h", "--json"])
    assert code == 0, err
    assert [row["job_id"] for row in json.loads(out)] == [f"c-{3:012x}", f"c-{2:012x}"]  # the live one, then
    code, out, err = run_cli(["jobs", "queue", "--limit", "1"])
    assert code == 0 and "2 more ended managed jobs: `corral jobs queue --page 2`, `--since 1d`, or `--all`" in err
