"""Property: no request to the server, whatever its parameters and body, makes it fail (5xx) or answer
anything but JSON that says what is wrong. The requests are drawn from the server's own OpenAPI
document (every path, method and declared parameter, plus junk), against a real server whose clusters
refuse connections at once, so that every handler runs its whole path without a testbed."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

VALUES = st.one_of(st.sampled_from(["", "0", "-1", "1e400", "nan", "true", "H100", "slurm/alpine", "k8s/x",
                                    "c-", "x" * 300, "%00", "..", "/", "é"]),
                   st.text(max_size=20), st.integers().map(str))


@pytest.fixture
def server(refusing_clusters):
    from corral.sdk import Client

    client = Client()
    with urllib.request.urlopen(f"{client.endpoint.url}/v1/openapi.json", timeout=10) as response:
        document = json.loads(response.read())
    operations = [(path, method.upper(), [p["name"] for p in spec.get("parameters", [])])
                  for path, methods in document["paths"].items() for method, spec in methods.items()]
    return client.endpoint, operations


DIGESTS = st.one_of(st.just("0" * 64), st.text("0123456789abcdef", min_size=64, max_size=64), VALUES)
TASK_TEXT = st.one_of(st.sampled_from(["run: echo hi", "resources:\n  accelerators: H100:1\nrun: x",
                                       "workdir: .\nrun: ls", "resources: [", "envs:\n  CORRAL_X: 1",
                                       "file_mounts:\n  /d: x", "num_nodes: 0", "{}", "- a"]), st.text(max_size=40))
SCRIPT_TEXT = st.one_of(st.sampled_from([
    "#!/bin/bash\n#SBATCH --gres=gpu:h100:1 -t 5\necho hi\n", "#!/bin/bash\n#SBATCH --array=0-3%2 -c 1\ntrue\n",
    "#!/bin/bash\n#SBATCH -M other\n", "#!/bin/bash\n#SBATCH -d afterok:c-0123abcd\n", "#SBATCH -N 1\n",
    "#!/bin/bash\n#SBATCH -N 1\n#SBATCH hetjob\n#SBATCH -N 2 --mem-per-cpu=1G\n", "#!/bin/bash\n#SBATCH -J 'x\n"]),
    st.text(max_size=60).map(lambda t: "#!/bin/bash\n#SBATCH " + t))
SCRIPT = st.fixed_dictionaries({"text": SCRIPT_TEXT}, optional={
    "file_name": VALUES, "options": st.lists(st.one_of(VALUES, st.sampled_from(["-p", "--gres=gpu:x:1", "-N"])),
                                             max_size=3),
    "args": st.lists(VALUES, max_size=2)})
TASK_INPUT = st.fixed_dictionaries({}, optional={
    "source": VALUES, "yaml": TASK_TEXT, "run": VALUES, "script": SCRIPT,
    "files": st.fixed_dictionaries({}, optional={"workdir": DIGESTS, "workdir_origin": VALUES,
                                                 "file_mounts": st.dictionaries(VALUES, DIGESTS, max_size=2)})})
OVERRIDES = st.fixed_dictionaries({}, optional={
    "name": VALUES, "gpus": VALUES, "infra": VALUES, "num_nodes": st.integers(-2, 200_000), "cpus": VALUES,
    "memory": VALUES, "envs": st.lists(VALUES, max_size=2), "secrets": st.lists(VALUES, max_size=2), "time": VALUES})


def requests(operations):
    def build(op, query, path_value, number, digest, body):
        path, method, params = op
        path = (path.replace("{job}", urllib.parse.quote(path_value, safe=""))
                .replace("{name}", urllib.parse.quote(path_value, safe=""))
                .replace("{number}", urllib.parse.quote(number, safe=""))
                .replace("{digest}", urllib.parse.quote(digest, safe="")))
        return method, path, query, body

    query = st.lists(st.tuples(st.one_of(st.sampled_from(["cluster", "gpu", "infra", "timeout", "limit", "page",
                                                           "since", "allocation", "by_sweep", "follow", "all",
                                                           "name", "command", "owner", "state", "hours"]),
                                         st.text(max_size=8)), VALUES), max_size=5)
    structured = st.one_of(
        st.fixed_dictionaries({}, optional={"jobs": st.lists(VALUES, max_size=3),
                                            "all": st.one_of(st.booleans(), VALUES)}),
        st.fixed_dictionaries({"tasks": st.lists(TASK_INPUT, max_size=3)},
                              optional={"overrides": OVERRIDES, "num_jobs": st.integers(-1, 20_000),
                                        "dryrun": st.booleans()}),
        st.fixed_dictionaries({"task": TASK_INPUT},
                              optional={"overrides": OVERRIDES, "num_jobs": st.integers(-1, 20_000),
                                        "idle_minutes": st.one_of(st.floats(allow_nan=False), VALUES),
                                        "walltime": VALUES, "wait": st.booleans()}),
        st.fixed_dictionaries({"name": VALUES},
                              optional={"role": st.one_of(st.sampled_from(["user", "admin"]), VALUES),
                                        "unix_users": st.dictionaries(VALUES, VALUES, max_size=2),
                                        "service": st.one_of(st.booleans(), VALUES),
                                        "expires_in_days": st.one_of(st.floats(), st.integers(), VALUES)}),
        st.fixed_dictionaries({"unix_users": st.one_of(st.dictionaries(VALUES, VALUES, max_size=2), VALUES)}),
    )
    bodies = st.one_of(st.none(), st.just(b"{"), st.just(b"[]"), st.binary(max_size=64),
                       structured.map(lambda d: json.dumps(d).encode()))
    return st.builds(build, st.sampled_from(operations), query, VALUES.filter(bool),
                     st.one_of(st.integers(0, 3).map(str), VALUES.filter(bool)), DIGESTS.filter(bool), bodies)


def test_no_request_makes_the_server_fail(server):
    endpoint, operations = server
    # Leave out what changes the server itself: waking the loop is harmless but pointless here.
    operations = [op for op in operations if op[0] != "/v1/wake"]

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(request=requests(operations))
    def one(request):
        method, path, query, body = request
        url = f"{endpoint.url}{path}?{urllib.parse.urlencode(query)}"
        headers = {"Authorization": f"Bearer {endpoint.token}", "Content-Type": "application/json"}
        req = urllib.request.Request(url, data=body if method in ("POST", "PUT") else None, method=method,
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                status, raw, kind = response.status, response.read(), response.headers.get_content_type()
        except urllib.error.HTTPError as exc:
            status, raw, kind = exc.code, exc.read(), exc.headers.get_content_type()
        assert status < 500, (method, url, body, raw[:300])
        if kind == "application/json":
            answer = json.loads(raw)
            if status >= 400:
                assert answer.get("detail"), (method, url, answer)
        elif kind == "application/x-ndjson" and not path.endswith("/queue/all"):  # launch, dev: events
            events = [json.loads(line) for line in raw.splitlines() if line.strip()]
            assert status == 200 and events and events[-1]["event"] in ("done", "error"), (method, url, raw[:300])
            assert all(e.get("kind") != "InternalError" for e in events), (method, url, body, raw[:500])
        else:  # the other streams: logs and queue/all
            assert status == 200 and path.endswith(("/logs", "/queue/all")), (method, url, kind)

    one()
