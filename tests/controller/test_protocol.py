"""protocol.py against a real server: a request head up to MAX_REQUEST_HEAD is read and answered; one
too long to read, or one that is not HTTP, gets the API's JSON refusal, and the answer reaches the client
that is still sending."""

from __future__ import annotations

import json

import pytest


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
    """A server that waits 1 s for a request's head."""
    from corral.controller import server as local_server
    from corral.sdk import Client
    from tests.conftest import refusing_cluster_file

    monkeypatch.setenv("CORRAL_SLURM_CONFIG", str(refusing_cluster_file(tmp_path)))
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CORRAL_REQUEST_HEAD_SECONDS", "1")
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
    started = time.monotonic()
    dribbling.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
    dribbling.settimeout(0.2)
    closed_after = None
    while closed_after is None and time.monotonic() - started < 10:
        try:
            dribbling.sendall(b"X-Slow: 1\r\n")
            if dribbling.recv(100) == b"":
                closed_after = time.monotonic() - started
        except TimeoutError:
            continue
        except ConnectionError:
            closed_after = time.monotonic() - started
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
