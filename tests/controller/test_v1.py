"""The server's /v1 API through the Python SDK, against the real testbed: typed results, errors,
the token, `corral api login`, and the published OpenAPI document."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from corral.sdk import ApiError, Client
from tests.conftest import wait_for

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_the_sdk_sees_what_the_cli_sees(corral, corral_env):
    client = Client()
    checks = client.check()
    assert [(c.cluster, c.ok) for c in checks] == [("alpine", True), ("borealis", True), ("cirrus", True)]
    assert [c.raw for c in checks][0]["default_partition"] == "gpu"
    report = client.gpus("H100")
    assert {(r.cluster, r.partition, r.total) for r in report.rows} == {("alpine", "gpu", 8),
                                                                         ("borealis", "h100-cluster", 16)}
    assert report.failures == []
    assert [r.raw for r in report.rows] == corral("gpus", "--json", "H100").json()
    launched = corral("launch", "-d", "--json", "--infra", "slurm/cirrus/debug", "-n", "sdk/lr=0.1", "--",
                      "echo from-sdk; sleep 600")
    assert launched.exit_code == 0, launched.stderr
    job_id = launched.json()["job_id"]
    page = client.queue()
    assert [j.job_id for j in page.jobs] == [job_id] and page.more == 0 and page.warnings == []
    wait_for("the job to run", lambda: client.job(job_id).state == "RUNNING", timeout=60)
    wait_for("its output", lambda: b"from-sdk" in b"".join(client.logs(job_id)), timeout=30)
    assert b"from-sdk" in b"".join(client.logs("sdk/lr=0.1"))  # by its name, slash and all (was Not Found)
    assert "from-sdk" in corral("logs", "--no-follow", "sdk/lr=0.1").stdout
    [outcome] = client.cancel(job_id)  # one job as it is, not a list (each character had been a job)
    assert (outcome.job_id, outcome.cancelled) == (job_id, True)
    ended = client.wait(job_id, poll=0.5, timeout=60)
    assert ended.state == "CANCELLED" and ended.ended
    assert [j.job_id for j in client.queue_all()] == [job_id]
    with pytest.raises(ApiError) as refused:
        client.job("c-nope")
    assert refused.value.status == 404 and refused.value.kind == "JobNotFoundError"
    with pytest.raises(ApiError) as bad:
        client.gpus(infra="aws/x")
    assert bad.value.status == 400 and "slurm" in str(bad.value)
    with pytest.raises(ApiError) as malformed:
        client.queue(limit=-1)  # 0 is the live jobs only (queue -s)
    assert malformed.value.status == 422 and "limit" in str(malformed.value)
    # One value given twice where the operation takes one is refused, not the last one kept (found by the
    # schemathesis run: `?gpu=…&gpu=…` answered 200); a list parameter takes several.
    with pytest.raises(ApiError) as twice:
        client._json("GET", "/gpus", {"gpu": ["A100", "H100"]})
    assert twice.value.status == 422 and "gpu" in str(twice.value) and "one value" in str(twice.value)
    with pytest.raises(ApiError) as listed:
        client.dev_status(["a", "b"])  # ?name=a&name=b: read as two names (there is no allocation "a")
    assert listed.value.status == 404 and "no dev allocation 'a'" in str(listed.value)


def test_a_wrong_token_is_refused_and_api_login_saves_nothing_then(corral, corral_env):
    local = Client()
    url = local.endpoint.url
    with pytest.raises(ApiError) as wrong:
        Client(url, "not-the-token").queue()
    assert wrong.value.status == 401
    failed = corral("api", "login", url, "--token", "not-the-token")
    assert failed.exit_code == 77 and "refused the token" in failed.stderr
    saved = Path(corral_env["CORRAL_HOME"]) / "api.json"
    assert not saved.exists()
    ok = corral("api", "login", url, "--token", local.endpoint.token)
    assert ok.exit_code == 0, ok.stderr
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    info = corral("api", "info", "--json").json()
    assert info["url"] == url and info["local"] is False  # the saved server, addressed as a remote one
    env = {**corral_env, "CORRAL_API_URL": "http://127.0.0.1:9", "CORRAL_API_TOKEN": "x"}
    unreachable = corral("queue", env=env)  # the environment wins over the saved login
    assert unreachable.exit_code == 69 and "http://127.0.0.1:9 did not answer" in unreachable.stderr
    assert "check CORRAL_API_URL, or unset it" in unreachable.stderr
    malformed = corral("queue", env={**env, "CORRAL_API_URL": "notaurl"})  # was an internal error
    assert malformed.exit_code == 78 and "CORRAL_API_URL 'notaurl' is not a Corral server's URL" in malformed.stderr
    assert corral("api", "logout").exit_code == 0 and not saved.exists()

    not_http = corral("api", "login", "ftp://x")  # refused before the token is asked for
    assert not_http.exit_code == 2 and "is not a Corral server's URL" in not_http.stderr, not_http.stderr
    assert "Token" not in not_http.stdout + not_http.stderr
    piped = subprocess.run([sys.executable, "-m", "corral", "api", "login", url], input=local.endpoint.token + "\n",
                           capture_output=True, text=True, env=corral_env, timeout=60)
    assert piped.returncode == 0 and "logged in to" in piped.stdout, piped.stderr
    assert "GetPassWarning" not in piped.stderr and json.loads(saved.read_text())["token"] == local.endpoint.token
    empty = subprocess.run([sys.executable, "-m", "corral", "api", "login", url], input="", capture_output=True,
                           text=True, env=corral_env, timeout=60)
    assert empty.returncode == 2 and "no token given" in empty.stderr, empty.stderr


def test_the_published_openapi_document_is_the_served_one(corral_env):
    import urllib.request

    client = Client()
    with urllib.request.urlopen(f"{client.endpoint.url}/v1/openapi.json", timeout=10) as response:
        served = json.loads(response.read())
    paths = set(served["paths"])
    assert {"/v1/check", "/v1/gpus", "/v1/queue", "/v1/queue/all", "/v1/jobs/{job}", "/v1/jobs/{job}/logs",
            "/v1/cancel", "/v1/managed", "/v1/managed/{job}", "/v1/health"} <= paths
    if os.environ.get("CORRAL_WRITE_OPENAPI"):
        DOCS.write_text(json.dumps(served, indent=2, sort_keys=True) + "\n")
    assert json.loads(DOCS.read_text()) == served, "regenerate: CORRAL_WRITE_OPENAPI=1 pytest " + __file__
