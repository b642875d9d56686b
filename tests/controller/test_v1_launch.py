"""controller/v1_launch.py: output streams (a client that stops reading holds up the reading) and the
warnings a task's text gets."""

from __future__ import annotations

import asyncio

from corral.controller.v1_launch import OUTPUT_BACKLOG, stream_output, warning_lines
from corral.pacing import keep_pace
from corral.task import parse_task


def test_an_output_stream_whose_client_stops_reading_stops_its_reader_and_loses_nothing():
    """The reader (as SshTransport.stream reads a remote log: a chunk to the sink, then keep_pace) hands
    on at most OUTPUT_BACKLOG chunks beyond what the client took; once the client reads again, every
    chunk arrives, in order."""
    total = OUTPUT_BACKLOG * 20
    handed: list[int] = []

    async def reader(sink) -> None:
        for i in range(total):
            sink(f"{i}\n".encode())
            handed.append(i)
            await keep_pace()

    async def scenario() -> None:
        body = stream_output(reader).body_iterator
        first = await body.__anext__()
        for _ in range(1000):  # the loop runs on while the client reads nothing
            await asyncio.sleep(0)
        assert first == b"0\n" and OUTPUT_BACKLOG <= len(handed) <= OUTPUT_BACKLOG + 2
        rest = [chunk async for chunk in body]
        assert [first, *rest] == [f"{i}\n".encode() for i in range(total)]

    asyncio.run(scenario())


def test_a_key_written_twice_is_warned_before_the_fields_slurm_ignores():
    text = "resources: {use_spot: true}\nenvs: {A: '1'}\nrun: true\nenvs: {B: '2'}\n"
    task = parse_task({"resources": {"use_spot": True}, "envs": {"B": "2"}, "run": "true"}, "t.yaml")
    lines = warning_lines(task, "t.yaml", text=text)
    assert [line.split(": ")[1] for line in lines] == ["envs", "resources.use_spot"]
    assert "the earlier one is ignored" in lines[0] and lines[0].startswith("t.yaml: ")
    assert warning_lines(task, "t.yaml") == lines[1:]  # no text (a command line): no repeats to find


def test_a_reader_that_fails_ends_the_stream_with_its_error_on_a_line_of_its_own():
    from corral.errors import ClusterUnreachableError, read_stream_error

    async def reader(sink) -> None:
        sink(b"epoch 1\n50%")  # a progress bar: no line end yet
        raise ClusterUnreachableError("lab2", "timed out")

    async def scenario() -> bytes:
        return b"".join([chunk async for chunk in stream_output(reader).body_iterator])

    body = asyncio.run(scenario())
    head, _, last = body[:-1].rpartition(b"\n")
    assert head == b"epoch 1\n50%" and read_stream_error(last + b"\n") == (
        "lab2: timed out", "ClusterUnreachableError", 69)


def test_a_reader_that_fails_by_a_bug_ends_the_stream_saying_so(capsys):
    from corral.errors import read_stream_error

    async def reader(sink) -> None:
        sink(b"epoch 1\n")
        raise KeyError("oops")

    async def scenario() -> bytes:
        return b"".join([chunk async for chunk in stream_output(reader).body_iterator])

    body = asyncio.run(scenario())
    assert body.startswith(b"epoch 1\n")
    assert read_stream_error(body[len(b"epoch 1\n"):]) == ("internal error: KeyError: 'oops'", "InternalError", 70)
    assert "KeyError: 'oops'" in capsys.readouterr().err  # the traceback, in the server's log
