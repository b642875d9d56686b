"""bodylimit.py against a real server: a body over MAX_REQUEST_BODY is refused with 413 before anything
parses it or asks for a token, and the client, still sending, reads the answer; an upload is not capped."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest

from corral.controller.bodylimit import MAX_REQUEST_BODY


def connect(server) -> http.client.HTTPConnection:
    address = urllib.parse.urlsplit(server.url)
    return http.client.HTTPConnection(address.hostname, address.port, timeout=60)


def refused(response: http.client.HTTPResponse) -> dict:
    answer = json.loads(response.read())
    assert response.status == 413 and answer["detail"]["kind"] == "BodyTooLarge", answer
    assert "over 16 MiB" in answer["detail"]["message"]
    return answer


def oversized() -> bytes:
    """A JSON body a byte over the cap: were it parsed, a task whose run is 16 MiB of `x`."""
    head = b'{"tasks": [{"run": "'
    return head + b"x" * (MAX_REQUEST_BODY - len(head) - 3) + b'"}]}'


@pytest.mark.parametrize("token", [None, "wrong", "the server's"])
def test_a_body_over_the_cap_is_refused_whoever_sends_it(refusing_server, token):
    body = oversized()
    assert len(body) == MAX_REQUEST_BODY + 1
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = "Bearer " + (refusing_server.token if token == "the server's" else token)
    connection = connect(refusing_server)
    try:
        connection.request("POST", "/v1/launch", body=body, headers=headers)  # sends it all, then reads
        refused(connection.getresponse())
    finally:
        connection.close()


def test_a_chunked_body_over_the_cap_is_refused_and_one_under_it_is_read(refusing_server):
    def chunks(body: bytes):
        for start in range(0, len(body), 1 << 20):
            yield body[start:start + (1 << 20)]

    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {refusing_server.token}"}
    connection = connect(refusing_server)
    try:
        connection.request("POST", "/v1/launch", body=chunks(oversized()), headers=headers, encode_chunked=True)
        refused(connection.getresponse())
    finally:
        connection.close()
    connection = connect(refusing_server)
    try:
        under = json.dumps({"tasks": [{"run": "true"}], "dryrun": True,
                            "overrides": {"infra": "slurm/nowhere"}}).encode()
        connection.request("POST", "/v1/launch", body=chunks(under), headers=headers, encode_chunked=True)
        response = connection.getresponse()
        answer = response.read()
        assert response.status == 200 and b"unknown cluster 'nowhere'" in answer, answer  # read, parsed, answered
    finally:
        connection.close()


def test_a_client_that_waits_to_be_asked_is_refused_before_it_sends(refusing_server):
    connection = connect(refusing_server)
    try:
        connection.putrequest("POST", "/v1/launch")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(10 * MAX_REQUEST_BODY))
        connection.putheader("Expect", "100-continue")
        connection.endheaders()  # and not a byte of the body
        refused(connection.getresponse())
    finally:
        connection.close()


def test_an_upload_over_the_cap_is_received(refusing_server, tmp_path):
    """Uploads stream to disk behind the token check: the body cap is not theirs (uploads.py has its own)."""
    import hashlib
    import io
    import os
    import tarfile

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        data = os.urandom(MAX_REQUEST_BODY + 1024)
        member = tarfile.TarInfo("file/weights.bin")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    body = archive.getvalue()
    digest = hashlib.sha256(body).hexdigest()
    connection = connect(refusing_server)
    try:
        connection.request("PUT", f"/v1/uploads/{digest}", body=body,
                           headers={"Authorization": f"Bearer {refusing_server.token}",
                                    "Content-Type": "application/x-tar"})
        response = connection.getresponse()
        answer = response.read()
        assert response.status == 200, answer
    finally:
        connection.close()
