"""An exec in a pool machine's dev allocation, its kept output and its cancel: the bash Corral sends,
run by a real bash in a session of its own (as sshd starts each session), against a stand-in holder."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from corral.infra.sshpool.dev import (
    CLAIMED,
    cancel_exec_script,
    exec_output_script,
    exec_script,
    go_script,
    idle_limit_script,
    release_script,
    setup_output_script,
    shell_command,
    states_script,
)
from corral.infra.sshpool.pool import _allocation_state
from corral.infra.sshpool.runner import RUNS_DIR
from tests.conftest import wait_for
from tests.helpers import runs_somewhere

TOKEN = "0123456789ab.0"


@pytest.fixture
def home(tmp_path: Path):
    """A home holding a ready allocation whose holder is a live process."""
    holder = subprocess.Popen(["sleep", "600"])
    d = tmp_path / RUNS_DIR / TOKEN
    (d / "workdir").mkdir(parents=True)
    since = Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    (d / "pid").write_text(f"{holder.pid} {since}\n")
    (d / "ready").touch()
    (d / "vars.sh").write_text("export CORRAL_NODE_RANK=0\n")
    yield tmp_path
    holder.kill()
    holder.wait()


def session(home: Path, script: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(["bash", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "HOME": str(home)}, start_new_session=True, **kwargs)


def running_exec(home: Path, exec_id: str, seconds: str) -> subprocess.Popen:
    """An exec of `sleep <seconds>` (a duration no other test's process uses: the tests look for it among
    every process on the machine), once it has said it started."""
    script = exec_script(TOKEN, exec_id, {}, f"echo started; sleep {seconds} & wait")
    runner = session(home, script)
    assert runner.stdin is not None and runner.stdout is not None
    runner.stdin.write(script)
    runner.stdin.close()
    assert runner.stdout.readline() == "started\n"
    return runner


def run(home: Path, script: str) -> tuple[int, str]:
    proc = session(home, script)
    out, _ = proc.communicate(script, timeout=30)
    return proc.returncode, out


def test_an_exec_shows_and_keeps_its_stdout_and_stderr(home):
    status, shown = run(home, exec_script(TOKEN, "c-0001", {"WORD": "it's"}, 'echo "out $WORD"; echo err >&2; exit 3'))
    assert (status, shown) == (3, "out it's\nerr\n")
    folder = home / RUNS_DIR / TOKEN / "exec" / "c-0001"
    assert (folder / "ended").exists()
    assert run(home, exec_output_script(TOKEN, "c-0001", follow=False)) == (0, "out it's\nerr\n")
    assert run(home, exec_output_script(TOKEN, "c-0001", follow=False, tail=1)) == (0, "err\n")
    assert run(home, exec_output_script(TOKEN, "c-0001", follow=True)) == (0, "out it's\nerr\n")  # ended: at once


def test_an_exec_with_setup_runs_it_first_and_its_run_only_if_it_succeeded(home):
    """`launch -c NAME` on a live allocation runs the task's setup again, in the same exec."""
    both = exec_script(TOKEN, "c-0011", {"WORD": "w"}, 'echo "run $WORD"', setup='echo "setup $WORD"')
    assert run(home, both) == (0, "setup w\nrun w\n")
    assert run(home, exec_output_script(TOKEN, "c-0011", follow=False)) == (0, "setup w\nrun w\n")  # both kept
    failed = exec_script(TOKEN, "c-0012", {}, "echo never", setup="echo installing; exit 5")
    status, shown = run(home, failed)
    assert status == 5 and shown.startswith("installing\ncorral: setup failed on ") and shown.endswith(
        " with exit code 5; the run did not start\n"), shown
    assert run(home, exec_output_script(TOKEN, "c-0012", follow=False)) == (0, shown)
    assert (home / RUNS_DIR / TOKEN / "exec" / "c-0012" / "ended").read_text() == "5\n"
    assert run(home, exec_script(TOKEN, "c-0013", {}, "", setup="echo only setup")) == (0, "only setup\n")


def test_autostop_gives_the_holder_a_new_limit_counted_from_now(home):
    d = home / RUNS_DIR / TOKEN
    (d / "last_active").touch()
    os.utime(d / "last_active", (1, 1))
    assert run(home, idle_limit_script(TOKEN, 360)) == (0, "")
    assert (d / "idle_limit").read_text() == "360\n" and (d / "last_active").stat().st_mtime > 1
    assert run(home, idle_limit_script("ba9876543210.0", 360)) == (0, "")  # no such allocation here: nothing


def test_cancel_ends_the_exec_and_its_followers_not_the_holder(home):
    # Its own duration: a testbed job's `sleep 300` still being cancelled once failed the check below.
    runner = running_exec(home, "c-0002", "3017")
    follower = session(home, exec_output_script(TOKEN, "c-0002", follow=True))
    follower.stdin.write(exec_output_script(TOKEN, "c-0002", follow=True))
    follower.stdin.close()
    assert follower.stdout.readline() == "started\n"
    assert run(home, cancel_exec_script(TOKEN, "c-0002")) == (0, "")
    assert runner.wait(timeout=15) == -15  # its whole session (TERM), the command's own children too
    assert follower.wait(timeout=15) == 0
    folder = home / RUNS_DIR / TOKEN / "exec" / "c-0002"
    assert (folder / "ended").exists()
    pid = (home / RUNS_DIR / TOKEN / "pid").read_text().split()[0]
    assert Path(f"/proc/{pid}").exists()  # the holder lives on
    wait_for("no sleep 3017 left", lambda: not runs_somewhere("sleep", "3017"), timeout=15)
    assert run(home, cancel_exec_script(TOKEN, "c-0002")) == (0, "")  # ended already: nothing to do


def test_a_cancel_that_lands_before_the_exec_began_or_between_its_setup_and_run_stops_it(home):
    """The cancel found no process (no `pid` yet, or a moment between setup and run), so the exec ran on
    regardless: its marker now stops it where it is."""
    assert run(home, cancel_exec_script(TOKEN, "c-0006")) == (0, "")  # before its script has started
    assert run(home, exec_script(TOKEN, "c-0006", {}, "echo never")) == (143, "")
    # What setup's last moment looks like when the cancel lands right then: the marker, and no process left.
    setup = "echo setup; : > ../exec/c-0007/cancelled"  # it runs in the allocation's workdir
    assert run(home, exec_script(TOKEN, "c-0007", {}, "echo never", setup=setup)) == (143, "setup\n")
    assert (home / RUNS_DIR / TOKEN / "exec" / "c-0007" / "ended").read_text() == "143\n"
    assert run(home, cancel_exec_script("ba9876543210.0", "c-0008")) == (0, "")  # no such allocation: no folder made
    assert not (home / RUNS_DIR / "ba9876543210.0").exists()


def test_down_ends_the_execs_still_running_in_the_allocation(home):
    """Else they would go on using the GPUs the holder gives back to the machine's queue."""
    runner = running_exec(home, "c-0009", "3019")
    assert run(home, release_script([TOKEN])) == (0, "")
    assert runner.wait(timeout=15) == -15
    wait_for("no sleep 3019 left", lambda: not runs_somewhere("sleep", "3019"), timeout=15)
    # Gone, even where the exec's trap wrote its `ended` while the folder was being removed (it was left
    # behind then, once in a CI run): removed once more when its processes have ended.
    wait_for("its run dir to go", lambda: not (home / RUNS_DIR / TOKEN).exists(), timeout=15)


def test_exec_ids_are_checked_before_they_reach_bash():
    for bad in ("../x", "c-1;rm", "", "c 1"):
        with pytest.raises(ValueError):
            exec_script(TOKEN, bad, {}, "true")
        with pytest.raises(ValueError):
            cancel_exec_script(TOKEN, bad)


def test_the_allocation_s_state_names_the_execs_that_ended_with_their_status(home):
    assert run(home, exec_script(TOKEN, "c-0003", {}, "exit 6"))[0] == 6
    assert run(home, exec_script(TOKEN, "c-0004", {}, "true"))[0] == 0
    status, out = run(home, states_script([TOKEN]))
    [line] = [x for x in out.splitlines() if x.startswith(TOKEN)]
    parts = line.split()
    assert status == 0 and len(parts) == 8 and parts[1:3] == ["1", "1"]
    assert sorted(parts[6].rstrip(",").split(",")) == ["c-0003:6", "c-0004:0"]
    # Over only once over on every rank; the lowest rank's failure is the exec's status.
    rank0 = [TOKEN, "1", "1", "-", "-", "-", "c-0003:0,c-0004:0,c-0005:2,", "-"]
    rank1 = [TOKEN, "1", "1", "-", "-", "-", "c-0003:7,c-0005:3,", "-"]
    state = _allocation_state(["lab1", "lab2"], [rank0, rank1], {})
    assert state.ended_execs == {"c-0003": 7, "c-0005": 2}


def test_a_live_allocation_shows_its_time_left_and_one_its_walltime_ended_says_so():
    soon = str(int(time.time()) + 3600 + 90)
    ready = [TOKEN, "1", "1", "-", "-", "-", "-", soon]
    state = _allocation_state(["lab1", "lab2"], [ready, [*ready[:7], str(int(soon) + 60)]], {})
    assert state.phase == "READY" and state.time_left in ("1:01:30", "1:01:29")  # the first machine's to end
    assert _allocation_state(["lab1"], [[TOKEN, "1", "1", "-", "-", "-", "-", "-"]], {}).time_left is None
    ended = _allocation_state(["lab1"], [[TOKEN, "0", "1", "-", "-", "walltime", "-", soon]], {})
    assert (ended.phase, ended.reason, ended.time_left) == ("ENDED", "walltime ended", None)


def test_a_failed_setup_s_last_lines_come_with_the_state(home):
    """A pool allocation whose setup failed said only its exit code; its output was in the holder's log."""
    d = home / RUNS_DIR / TOKEN
    (d / "setup_failed").write_text("4\n")
    (d / "log.txt").write_text("".join(f"line {i}\n" for i in range(20)) + "pip: no such package\n")
    status, out = run(home, states_script([TOKEN]))
    said = [x.split(" ", 3)[3] for x in out.splitlines() if x.startswith(f"@@corral said {TOKEN} ")]
    assert status == 0 and said == [f"line {i}" for i in range(6, 20)] + ["pip: no such package"]
    [line] = [x.split() for x in out.splitlines() if x.startswith(TOKEN)]
    state = _allocation_state(["lab1"], [line], {}, ["\n".join(said)])
    assert (state.phase, state.reason) == ("FAILED", "setup failed with exit code 4")
    assert state.setup_output.endswith("line 19\npip: no such package")


def test_a_multi_machine_exec_naming_gpus_claims_them_says_so_and_waits_for_the_go(home):
    """Each rank takes its GPUs (the positions of the allocation's devices), says CLAIMED on stdout
    only, and starts once `go_script` has run on its machine; a cancel while it waits ends it."""
    d = home / RUNS_DIR / TOKEN
    (d / "vars.sh").write_text("export CORRAL_NODE_RANK=1 CUDA_VISIBLE_DEVICES=4,5,6,7 CORRAL_NUM_GPUS_PER_NODE=4\n")
    script = exec_script(TOKEN, "c-0021", {}, 'echo "cvd=$CUDA_VISIBLE_DEVICES n=$CORRAL_NUM_GPUS_PER_NODE"',
                         gpus_claimed=2, gpus_held=4, wait_for_go=True)
    rank = session(home, script)
    rank.stdin.write(script)
    rank.stdin.close()
    assert rank.stdout.readline() == CLAIMED + "\n"
    assert rank.poll() is None  # waits for the go
    assert run(home, go_script(TOKEN, "c-0021")) == (0, "")
    assert (rank.wait(timeout=15), rank.stdout.read()) == (0, "cvd=4,5 n=2\n")
    assert run(home, exec_output_script(TOKEN, "c-0021", follow=False)) == (0, "cvd=4,5 n=2\n")  # not CLAIMED
    # The first has ended, so its slots are free again for the next, which a cancel ends while it waits.
    other = exec_script(TOKEN, "c-0022", {}, "echo never", gpus_claimed=2, gpus_held=4, wait_for_go=True)
    waiting = session(home, other)
    waiting.stdin.write(other)
    waiting.stdin.close()
    assert waiting.stdout.readline() == CLAIMED + "\n"
    assert run(home, cancel_exec_script(TOKEN, "c-0022")) == (0, "")
    assert waiting.wait(timeout=15) in (143, -15) and waiting.stdout.read() == ""


def test_until_line_keeps_back_one_line_across_chunks_and_passes_the_rest_in_order():
    from corral.infra.sshpool.pool import _UntilLine

    seen: list[str] = []
    out: list[bytes] = []
    sink = _UntilLine("corral: claimed", lambda: seen.append("claimed"), out.append)
    for chunk in (b"waiting\ncorral: cl", b"aimed\nrun", b" output\n", b"corral: claimed\n"):
        sink(chunk)
    assert seen == ["claimed"] and b"".join(out) == b"waiting\nrun output\ncorral: claimed\n"


def test_the_setup_output_follower_stops_once_setup_is_over_or_the_holder_is_gone(home):
    d = home / RUNS_DIR / TOKEN
    (d / "log.txt").write_text("installing\ninstalled\n")
    assert run(home, setup_output_script(TOKEN)) == (0, "installing\ninstalled\n")  # ready: at once, all of it
    (d / "ready").unlink()
    (d / "pid").write_text("999999 1\n")  # its holder died with no exit code written
    assert run(home, setup_output_script(TOKEN)) == (0, "installing\ninstalled\n")
    (d / "pid").unlink()  # not started yet: it waits for the log, then follows it as setup writes it
    (d / "log.txt").unlink()
    follower = session(home, setup_output_script(TOKEN))
    follower.stdin.write(setup_output_script(TOKEN))
    follower.stdin.close()
    with (d / "log.txt").open("a") as log:
        log.write("step 1\n")
        log.flush()
        wait_for("the follower to print the first line", lambda: follower.stdout.readline() == "step 1\n", 10)
        log.write("corral: setup failed on m1 with exit code 2\n")
    (d / "setup_failed").write_text("2\n")
    assert follower.wait(timeout=10) == 0
    assert follower.stdout.read() == "corral: setup failed on m1 with exit code 2\n"


def test_down_ends_the_ssh_sessions_in_the_allocation_whatever_their_process_groups(home):
    """A `corral ssh` session went on after `down`, using the GPUs the holder gave back. Its leader is
    recorded in `sessions/`; its jobs may be in process groups of their own (an interactive shell's are,
    `set -m` here) and ignore TERM, so each of its processes is ended, with KILL 10 s later."""
    command = 'set -m; trap "" TERM; sleep 3037 & echo started; wait'
    shell = subprocess.Popen(["bash", "-c", shlex.split(shell_command(TOKEN, command))[2]], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "HOME": str(home)}, start_new_session=True)
    assert shell.stdout is not None and shell.stdout.readline() == "started\n"
    assert [p.name for p in (home / RUNS_DIR / TOKEN / "sessions").iterdir()] == [str(shell.pid)]
    assert run(home, release_script([TOKEN])) == (0, "")
    assert shell.wait(timeout=20) != 0
    wait_for("no sleep 3037 left", lambda: not runs_somewhere("sleep", "3037"), timeout=15)
