"""The bash every backend writes the same way, run by a real bash."""

from __future__ import annotations

import os
import re
import socket
import subprocess

import pytest

from corral.infra.shell import check_token, checked, claim_gpus, narrow_gpus, write_file

CONTENTS = {
    "script.sh": "#!/bin/bash\necho 'single' \"double\" $HOME `uname` $(touch ran)\n",
    "no-final-newline": "last line",
    "empty": "",
    "blank-lines": "\n\n  indented\t\ttabs\n\n",
    "unicode": "héllo — wörld ✓\n",
    "looks-like-a-delimiter": "CORRAL_EOF_0123456789abcdef\nEOF\n'\n",
}


def test_files_are_written_byte_for_byte_and_nothing_in_them_runs(tmp_path):
    script = 'd="$1"\n' + "\n".join(write_file(f'"$d"/{name}', content) for name, content in CONTENTS.items())
    done = subprocess.run(["bash", "-s", "--", str(tmp_path)], input=script, capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for name, content in CONTENTS.items():
        assert (tmp_path / name).read_bytes() == content.encode(), name
    assert not (tmp_path / "ran").exists()


def test_any_text_arrives_exactly(tmp_path):
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=60, deadline=None)
    @given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=300))
    def arrives(content: str) -> None:
        target = tmp_path / "f"
        done = subprocess.run(["bash", "-s", "--", str(target)], input=write_file('"$1"', content).encode(),
                              capture_output=True)
        assert done.returncode == 0 and target.read_bytes() == content.encode()

    arrives()


def claim(run_dir, exec_id: str, wanted: int, held: int, still_held: str = "true") -> subprocess.CompletedProcess:
    script = (f'd={run_dir}\n' + claim_gpus(exec_id, wanted, held, still_held)
              + 'echo "slots=$CORRAL_GPU_SLOTS n=$CORRAL_NUM_GPUS_PER_NODE"\n')
    return subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, timeout=30)


def test_an_exec_takes_free_gpu_slots_and_those_of_execs_that_are_gone(tmp_path):
    (tmp_path / "gpus").mkdir()
    (tmp_path / "exec" / "7").mkdir(parents=True)
    (tmp_path / "exec" / "7" / "ended").write_text("0\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    me, alive = socket.gethostname(), os.getpid()
    claims = {0: f"7 {me} {alive}",  # its exec has ended
              1: f"8 {me} {gone.pid}",  # its script is gone from this host
              2: f"9 elsewhere {gone.pid}",  # another login node's: only its `ended` marker frees it
              3: f"10 {me} {alive}"}  # running here
    for slot, text in claims.items():
        (tmp_path / "gpus" / str(slot)).write_text(text + "\n")
    done = claim(tmp_path, "11", 2, 5)
    assert (done.returncode, done.stdout) == (0, "slots=0,1 n=2\n"), done.stderr
    for slot in (0, 1):
        assert (tmp_path / "gpus" / str(slot)).read_text().split()[:2] == ["11", me]
    assert (tmp_path / "gpus" / "2").read_text() == claims[2] + "\n"
    (tmp_path / "gpus" / "0").write_text(f"11 {me} {alive}\n")  # as if 11 still ran: slot 1 is freed with its script
    last = claim(tmp_path, "12", 2, 5)
    assert (last.returncode, last.stdout) == (0, "slots=1,4 n=2\n"), last.stderr


def test_an_exec_waiting_for_gpus_stops_when_cancelled_or_when_its_allocation_ends(tmp_path):
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "0").write_text(f"3 {socket.gethostname()} {os.getpid()}\n")
    ended = claim(tmp_path, "4", 1, 1, still_held="false")
    assert ended.returncode == 75 and "the allocation ended while this job waited" in ended.stderr, ended
    (tmp_path / "exec" / "5").mkdir(parents=True)
    (tmp_path / "exec" / "5" / "cancelled").touch()
    cancelled = claim(tmp_path, "5", 1, 1)
    assert cancelled.returncode == 143 and cancelled.stdout == "", cancelled


def test_a_node_narrows_its_gpus_to_the_slots_its_exec_took():
    script = narrow_gpus() + 'echo "${CUDA_VISIBLE_DEVICES-unset} ${GPU_DEVICE_ORDINAL-unset} ${ROCR_VISIBLE_DEVICES-unset}"'
    env = {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "4,5,6,7", "GPU_DEVICE_ORDINAL": "4,5,6,7",
           "CORRAL_GPU_SLOTS": "1,3"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert done.stdout == "5,7 5,7 unset\n", done.stderr
    untouched = subprocess.run(["bash", "-c", script], env={**env, "CORRAL_GPU_SLOTS": ""}, capture_output=True,
                               text=True)
    assert untouched.stdout == "4,5,6,7 4,5,6,7 unset\n", untouched.stderr


def test_a_value_reaches_a_command_line_only_as_its_pattern_allows():
    assert checked(re.compile(r"^\d+\Z"), "4711", "a Slurm job id") == "4711"
    with pytest.raises(ValueError, match=r"^not a Slurm job id: '4711; rm -rf ~'$"):
        checked(re.compile(r"^\d+\Z"), "4711; rm -rf ~", "a Slurm job id")
    assert check_token("0123456789ab.2") == "0123456789ab.2"
    with pytest.raises(ValueError, match="not an attempt token"):
        check_token("0123456789ab\n")
