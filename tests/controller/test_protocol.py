"""protocol.py against a real server: a request head up to MAX_REQUEST_HEAD is read and answered; one
too long to read, or one that is not HTTP, gets the API's JSON refusal, and the answer reaches the client
that is still sending. A head that does not come in time, or a body that comes too slowly, closes
the connection."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import wait_for


def test_the_longest_query_the_api_allows_gets_an_answer(refusing_server):
    """h11 dropped the connection, without a word, on a request head over 16 KiB."""
    import urllib.error
    import urllib.parse
    import urllib.request

    command = urllib.parse.quote("é" * 8192)  # 12 bytes a character, percent-encoded
    request = urllib.request.Request(f"{refusing_server.url}/v1/dev/nothere/ssh?command={command}",
                                     headers={"Authorization": f"Bearer {refusing_server.token}"})
    try:
        urllib.request.urlopen(request, timeout=30)
        status = 200
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert status == 404  # no such dev allocation: asked and answered


def test_a_request_too_long_to_read_is_refused_with_an_answer(refusing_server):
    """uvicorn answered a head over its limit with text/plain and closed at once, the rest of the
    request unread: the kernel reset the connection and the client lost the answer (schemathesis drew a
    447 KB query for GET /v1/dev). Now: the JSON refusal, then a close once the client has sent all."""
    import urllib.error
    import urllib.parse
    import urllib.request

    names = "&".join(f"name={urllib.parse.quote('é' * 50)}" for _ in range(4000))  # 1.2 MB
    for _ in range(3):
        request = urllib.request.Request(f"{refusing_server.url}/v1/dev?{names}",
                                         headers={"Authorization": f"Bearer {refusing_server.token}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        answer = json.loads(refused.value.read())
        assert refused.value.code == 431 and answer["detail"]["kind"] == "RequestTooLarge", answer
        assert "over 256 KiB" in answer["detail"]["message"]


def test_a_request_that_is_not_http_is_refused_in_json(refusing_server):
    import socket

    host, port = refusing_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):  # the server closes once it has answered
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head.lower(), head
    assert json.loads(body)["detail"]["kind"] == "MalformedRequest"


@pytest.fixture
def impatient_server(tmp_path, monkeypatch):
    """A server that waits 1 s for a request's head, and holds a body to its rate in windows of 1 s."""
    from corral.controller import server as local_server
    from corral.sdk import Client
    from tests.conftest import refusing_cluster_file

    monkeypatch.setenv("CORRAL_SLURM_CONFIG", str(refusing_cluster_file(tmp_path)))
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CORRAL_REQUEST_HEAD_SECONDS", "1")
    monkeypatch.setenv("CORRAL_REQUEST_BODY_SECONDS", "1")
    try:
        yield Client().endpoint
    finally:
        local_server.stop()


def test_a_request_head_that_does_not_come_in_time_closes_the_connection(impatient_server):
    """uvicorn kept both of these open for ever (20 s of dribbling and 15 s of silence were tried)."""
    import socket
    import time

    host, port = impatient_server.url.removeprefix("http://").split(":")
    silent = socket.create_connection((host, int(port)), timeout=10)
    dribbling = socket.create_connection((host, int(port)), timeout=10)
    dribbling.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
    closed_after = seconds_until_closed(dribbling, b"X-Slow: 1\r\n")
    assert closed_after is not None and closed_after < 5, closed_after
    assert silent.recv(100) == b""  # closed too, with nothing said
    silent.close()
    dribbling.close()

    # a request that comes whole, and the next one on the same connection after a pause, are answered
    import http.client

    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    for _ in range(2):
        connection.request("GET", "/v1/health", headers={"Authorization": f"Bearer {impatient_server.token}"})
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["pid"] > 0
        time.sleep(1.5)  # longer than the head's deadline: it runs only while a head is coming
    connection.close()


def seconds_until_closed(connection, piece: bytes, every: float = 0.2, within: float = 10) -> float | None:
    """Send `piece` every `every` seconds until the server closes the connection: the seconds that took,
    or None if it was still open after `within`."""
    import time

    started = time.monotonic()
    connection.settimeout(every)
    while time.monotonic() - started < within:
        try:
            connection.sendall(piece)
            if connection.recv(100) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionError:
            return time.monotonic() - started
    return None


def test_a_body_that_trickles_closes_the_connection_and_one_that_flows_is_read(impatient_server):
    """uvicorn kept a connection whose body came a few bytes at a time open for as long as bytes came
    (10 bytes every 0.2 s for 20 s was tried): here each second of body must bring 500 bytes."""
    import socket
    import time

    body = json.dumps({"tasks": [{"run": "true"}], "dryrun": True,
                       "overrides": {"infra": "slurm/nowhere"}}).encode() + b" " * 6000
    head = (f"POST /v1/launch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {impatient_server.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    host, port = impatient_server.url.removeprefix("http://").split(":")
    trickling = socket.create_connection((host, int(port)), timeout=10)
    trickling.sendall(head)
    closed_after = seconds_until_closed(trickling, b" " * 10)  # 50 bytes a second
    trickling.close()
    assert closed_after is not None and closed_after < 5, closed_after

    # an upload, which the operation reads as it comes: closed too, its part removed, a line logged
    uploading = socket.create_connection((host, int(port)), timeout=10)
    uploading.sendall((f"PUT /v1/uploads/{'a' * 64} HTTP/1.1\r\nHost: x\r\n"
                       f"Authorization: Bearer {impatient_server.token}\r\nContent-Type: application/x-tar\r\n"
                       "Content-Length: 100000\r\n\r\n").encode())
    closed_after = seconds_until_closed(uploading, b"x" * 10)
    uploading.close()
    assert closed_after is not None and closed_after < 5, closed_after
    home = Path(os.environ["CORRAL_HOME"])
    wait_for("the upload's part removed", lambda: not list((home / "uploads").glob(".incoming-*")), timeout=10)
    log = home / "controller.log"
    wait_for("the server's note", lambda: "/v1/uploads/aaaa" in log.read_text(), timeout=10)
    assert "the client went before its body had all come" in log.read_text()
    assert "Traceback" not in log.read_text()

    with socket.create_connection((host, int(port)), timeout=10) as flowing:  # 4,000 bytes a second, for 1.5 s
        flowing.sendall(head)
        for start in range(0, len(body), 1000):
            time.sleep(0.25)
            flowing.sendall(body[start:start + 1000])
        answer = b""
        while b"unknown cluster" not in answer and (chunk := flowing.recv(65536)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ") and b"unknown cluster 'nowhere'" in answer, answer
