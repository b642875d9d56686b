"""routing.py: a path parameter may hold a slash, sent percent-encoded as one segment."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from corral.controller.routing import SLASH, segmented_path


def test_a_path_is_decoded_segment_by_segment():
    assert segmented_path(b"/v1/jobs/exp%2Flr%3D0.1/logs") == f"/v1/jobs/exp{SLASH}lr=0.1/logs"
    assert segmented_path(b"/v1/jobs/%2F%2F") == f"/v1/jobs/{SLASH}{SLASH}"
    assert segmented_path(b"/v1/jobs/a%EE%80%80b%2F") is None  # holds the placeholder itself: as before
    assert segmented_path("/v1/jobs/é%2F".encode()) is None  # not ASCII: as before


@pytest.mark.parametrize("method, path, status, kind, message", [
    ("GET", "/v1/jobs/exp%2Flr%3D0.1", 404, "JobNotFoundError", "no job 'exp/lr=0.1'"),
    ("GET", "/v1/jobs/a%2fb/logs", 404, "JobNotFoundError", "no job 'a/b'"),
    ("GET", "/v1/managed/a%2Fb", 404, "JobNotFoundError", "no managed job 'a/b'"),
    ("POST", "/v1/dev/bad%2Fname", 400, "TaskError", "invalid allocation name 'bad/name'"),
])
def test_a_name_with_a_slash_reaches_its_route(refusing_server, method, path, status, kind, message):
    """Before, each of these was the framework's 404 "Not Found": no route had matched."""
    body = json.dumps({"task": {"run": "true"}}).encode() if method == "POST" else None
    request = urllib.request.Request(f"{refusing_server.url}{path}", data=body, method=method,
                                     headers={"Authorization": f"Bearer {refusing_server.token}",
                                              "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    detail = json.loads(refused.value.read())["detail"]
    assert (refused.value.code, detail["kind"]) == (status, kind) and detail["message"].startswith(message), detail
