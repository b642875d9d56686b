"""schemathesis against the published OpenAPI document: every operation, with requests drawn from
its declared parameters and bodies (and, in the negative phase, requests that break them), against a
real server whose clusters refuse connections at once. Each answer must not be a server error, must
use a status and content type the document declares, must match the declared response schema;
schema-breaking requests must be refused, and so must the same request without the bearer token the
document asks for. test_api_fuzz.py draws Corral's own junk (task texts, scripts, digests) through the
same server; this one takes the document at its word."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from tests.conftest import refusing_cluster_file
from tests.helpers import free_port

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
schema = schemathesis.openapi.from_path(str(DOCS))

# Requests that only change the server itself (a tick now, a dashboard login link) prove nothing here.
LEFT_OUT = {("POST", "/v1/wake"), ("POST", "/v1/dashboard/link")}
# A request the schema allows may still be refused on purpose (an unknown cluster, a malformed task):
# positive_data_acceptance would call that a failure. Every other check runs.
EXCLUDED = [checks.positive_data_acceptance]


@pytest.fixture(scope="module")
def team_member(tmp_path_factory):
    """A team server on loopback (SQLite store) and a member's token: (url, token). A member is refused
    what is an admin's (users) or another user's, and `corral ssh` (403)."""
    work = tmp_path_factory.mktemp("team")
    env = {**os.environ, "CORRAL_SLURM_CONFIG": str(refusing_cluster_file(work)), "CORRAL_HOME": str(work / "home")}
    port = free_port()
    started = subprocess.run([sys.executable, "-m", "corral", "server", "start", "--host", "127.0.0.1", "--port",
                              str(port)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert started.returncode == 0, started.stderr
    try:
        added = subprocess.run([sys.executable, "-m", "corral", "users", "add", "member", "--json"], env=env,
                               capture_output=True, text=True, timeout=60, check=False)
        assert added.returncode == 0, added.stderr
        yield f"http://127.0.0.1:{port}", json.loads(added.stdout)["token"]
    finally:
        subprocess.run([sys.executable, "-m", "corral", "server", "stop"], env=env, capture_output=True, timeout=60,
                       check=False)


def keeps_to_the_document(case, url: str, token: str) -> None:
    if (case.method.upper(), case.operation.path) in LEFT_OUT:
        return
    # The document asks for a bearer token, so schemathesis makes one up; a negative case may leave it out,
    # and stays without. ignored_auth, among the checks, also sends each with no token and a wrong one.
    if case.headers and "Authorization" in case.headers:
        case.headers["Authorization"] = f"Bearer {token}"
    case.call_and_validate(base_url=url, excluded_checks=EXCLUDED, timeout=30)


@schema.include(method_regex="GET|POST|PUT|PATCH|DELETE").parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_keeps_to_its_document(case, refusing_server):
    keeps_to_the_document(case, refusing_server.url, refusing_server.token)


@schema.include(method_regex="GET|POST|PUT|PATCH|DELETE").parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_and_so_for_a_team_member(case, team_member):
    keeps_to_the_document(case, *team_member)


def post(server, path: str, body: object, token: str | None = None) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"{server.url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token or server.token}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_misspelt_field_or_a_loose_type_is_refused_not_ignored(refusing_server):
    status, answer = post(refusing_server, "/v1/cancel", {"jobs": ["c-0"], "al": True})
    assert status == 422 and answer["detail"][0]["loc"] == ["body", "al"]
    status, answer = post(refusing_server, "/v1/cancel", {"all": 0})
    assert status == 422 and answer["detail"][0]["loc"] == ["body", "all"]
    status, answer = post(refusing_server, "/v1/launch",
                          {"tasks": [{"run": "true"}], "overides": {"infra": "slurm/alpine"}})
    assert status == 422 and answer["detail"][0]["loc"] == ["body", "overides"]


def test_every_refusal_has_the_same_body(refusing_server):
    status, answer = post(refusing_server, "/v1/cancel", {"jobs": ["c-0"]}, token="wrong")
    assert status == 401 and answer["detail"]["kind"] == "Unauthenticated" and answer["detail"]["exit_code"] == 77
    status, answer = post(refusing_server, "/v1/cancel", {})
    assert status == 400 and answer["detail"] == {"message": "name the jobs to cancel, or use --all",
                                                  "kind": "CorralError", "exit_code": 1}


def test_a_method_a_path_does_not_have_is_answered_with_every_method_it_has(refusing_server):
    """Starlette's 405 named only the first matching route's methods (`Allow: POST` for /v1/users/x,
    which has PATCH and DELETE on two routes)."""
    import urllib.error
    import urllib.request

    for path, allowed in (("/v1/users/someone", "DELETE, PATCH"), ("/v1/managed", "GET, POST"),
                          ("/v1/dev/box", "DELETE, POST")):
        request = urllib.request.Request(f"{refusing_server.url}{path}", method="PUT",
                                         headers={"Authorization": f"Bearer {refusing_server.token}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 405 and refused.value.headers["Allow"] == allowed, path
