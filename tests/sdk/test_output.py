"""The SDK's log streams: the server's last line saying it could not read on (errors.stream_error_line)
is raised as OutputCutError once everything before it is out; the job's own lines never are."""

from __future__ import annotations

import pytest

from corral.errors import ClusterUnreachableError, TaskError, read_stream_error, stream_error_line
from corral.sdk import OutputCutError, _cut_raised


def test_an_error_line_round_trips_with_its_class_and_exit_status():
    line = stream_error_line(ClusterUnreachableError("lab2", "connection timed out\n(ssh: …)"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert read_stream_error(line) == ("lab2: connection timed out (ssh: …)", "ClusterUnreachableError", 69)
    assert read_stream_error(stream_error_line(TaskError("bad"))) == ("bad", "TaskError", 65)
    assert read_stream_error(b"corral: error: a job's own words\n") is None
    assert read_stream_error(b"corral: error: x (A, exit 1)\nmore (B, exit 2)\n") is None


@pytest.mark.parametrize("cut_at", [1, 5, 15, 40])
def test_the_servers_last_line_is_raised_after_the_output_in_any_chunking(cut_at):
    line = stream_error_line(ClusterUnreachableError("lab2", "timed out"))
    stream = b"epoch 1\nepoch 2\n" + line
    chunks = [stream[i:i + cut_at] for i in range(0, len(stream), cut_at)]
    out: list[bytes] = []
    with pytest.raises(OutputCutError) as cut:
        for chunk in _cut_raised(iter(chunks)):
            out.append(chunk)
    assert b"".join(out) == b"epoch 1\nepoch 2\n"
    assert (str(cut.value), cut.value.kind, cut.value.exit_code) == ("lab2: timed out", "ClusterUnreachableError", 69)


@pytest.mark.parametrize("text", [
    b"corral: error: the job's own last line\n",
    b"corral: error: x (ValueError, exit 3)\nand on\n",  # its own, with more after it
    b"corral: err",  # a last line cut short
    b"c" * 10 + b"\r" + b"c" * 10,
    b"corral: error: " + b"x" * 20_000,  # too long to be the server's: not held
    b"",
])
def test_everything_else_arrives_whole_and_nothing_is_raised(text):
    chunks = [text[i:i + 7] for i in range(0, len(text), 7)]
    assert b"".join(_cut_raised(iter(chunks))) == text


def test_a_line_that_may_become_the_error_is_held_only_until_the_next_chunk():
    stream = _cut_raised(iter([b"a\ncorr", b"al is fine\n"]))
    assert next(stream) == b"a\n"  # "corr" waits: it may begin the server's line
    assert next(stream) == b"corral is fine\n"
