"""A team server (`corral server start --host --port --db postgresql://…`) on a real PostgreSQL store and
the real testbed: users and their tokens, `corral api login`/`info`, and isolation, walked route by route
over the published API with two users' tokens and with none."""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from corral.sdk import ApiError, Client
from corral.sdk.files import LocalFiles
from tests.conftest import wait_for
from tests.helpers import free_port, logged_in

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"



@pytest.fixture
def team(corral, corral_env, fresh_postgres, clean_queues):
    """A team server on loopback, its store on PostgreSQL; yields its URL. This process's Client() is
    its admin (the server's own account, through controller.json)."""
    port = free_port()
    # These tests are about the API's users and isolation: one account submits for everyone.
    # (test_submit_as_user.py has each member's jobs run as their own account.)
    home = Path(corral_env["CORRAL_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("submit_as: service\n")
    started = corral("server", "start", "--host", "127.0.0.1", "--port", str(port), "--db", fresh_postgres)
    assert started.exit_code == 0, started.stderr
    assert f"at http://127.0.0.1:{port}" in started.stdout
    yield f"http://127.0.0.1:{port}"
    corral("server", "stop")


def add_user(corral, name: str, *extra: str) -> str:
    """Through the `corral` command (the fixture, or any callable running it)."""
    added = corral("users", "add", name, "--json", *extra)
    assert added.exit_code == 0, added.stderr
    assert added.json()["name"] == name
    return added.json()["token"]


def call(url: str, method: str, path: str, token: str | None, body: object = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def test_users_tokens_and_who_you_are(corral, corral_env, team, fresh_postgres):
    token = add_user(corral, "alice", "--unix-user", "alpine=alice", "--unix-user", "cirrus=alice2")
    assert token.startswith("corral_") and len(token) > 40
    again = corral("users", "add", "alice")
    assert again.exit_code == 65 and "exists already" in again.stderr
    bad = corral("users", "add", "bob", "--unix-user", "alpine")
    assert bad.exit_code == 65 and "CLUSTER=NAME" in bad.stderr
    for name in ("", "x" * 129, "a b"):  # one message says what a name may hold, empty or long as well
        bad = corral("users", "add", name)
        assert bad.exit_code == 65 and "is not a user name: use letters, digits" in bad.stderr, bad.stderr
    service = corral("users", "add", "ci", "--service")
    assert service.exit_code == 65 and "must expire" in service.stderr
    add_user(corral, "ci", "--service", "--expires", "30")
    listed = corral("users", "list", "--json").json()
    assert [(u["name"], u["role"], u["service"]) for u in listed] == [("alice", "user", False), ("ci", "user", True)]
    assert listed[0]["unix_users"] == {"alpine": "alice", "cirrus": "alice2"}
    assert token not in json.dumps(listed)

    # the store holds the token's hash, never the token
    from sqlalchemy import create_engine, text

    engine = create_engine(fresh_postgres)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash FROM users WHERE name = 'alice'")).scalar()
    engine.dispose()
    assert stored and token not in stored and len(stored) == 64

    # alice logs in from her own machine (here: another CORRAL_HOME)
    alice_home = Path(corral_env["CORRAL_HOME"]).parent / "alice-home"
    alice = {**corral_env, "CORRAL_HOME": str(alice_home)}
    login = corral("api", "login", team, "--token", token, env=alice)
    assert login.exit_code == 0, login.stderr
    assert "as alice (user" in login.stdout
    assert stat.S_IMODE((alice_home / "api.json").stat().st_mode) == 0o600
    info = corral("api", "info", env=alice)
    assert "you are alice (user); Unix accounts: alpine=alice, cirrus=alice2" in info.stdout, info.stdout
    refused = corral("users", "list", env=alice)
    assert refused.exit_code == 77 and "for admins" in refused.stderr
    by_env = corral("api", "info", "--json", env={**corral_env, "CORRAL_API_URL": team, "CORRAL_API_TOKEN": token})
    assert by_env.json()["user"]["name"] == "alice"

    # removed: the token stops working at once
    assert corral("users", "remove", "alice").stdout.strip() == "removed alice"
    gone = corral("queue", env=alice)
    assert gone.exit_code == 77, gone.stderr

    log = (Path(corral_env["CORRAL_HOME"]) / "controller.log").read_text()
    assert " alice GET /v1/me 200 " in log  # each request attributed...
    assert token not in log and token[7:] not in log  # ...and no token in the log


def test_no_route_shows_or_changes_another_users_objects(corral, corral_env, team, testbed, tmp_path):
    """bob's job, managed job, dev allocation and upload; alice (and nobody) walks every route of the
    published API at them. Every route must be walked: a new one fails this test until it is added."""
    alice, bob = add_user(corral, "alice"), add_user(corral, "bob")
    as_bob = Client(team, bob)
    launched = as_bob.launch(command="sleep 600", infra="slurm/cirrus/debug", name="bobs-job")
    job, slurm_id = launched.job_ids[0], launched.tasks[0][0].slurm_job_id
    [managed] = as_bob.managed_launch(command="sleep 600", infra="slurm/borealis", name="bobs-managed", cpus="1")
    box = as_bob.dev_launch("box", infra="slurm/alpine/cpu", cpus="1", wait=False)
    (tmp_path / "bobs-files").mkdir()
    (tmp_path / "bobs-files" / "train.py").write_text("print('bob')\n")
    upload = as_bob.send_files(LocalFiles(workdir=tmp_path / "bobs-files"))["workdir"]
    wait_for("bob's managed job to reach a cluster",
             lambda: as_bob.managed_job(managed)["attempt_list"], timeout=60)
    bobs = {job, managed, slurm_id, box["slurm_job_id"], "bobs-job", "bobs-managed"}

    walks = [
        ("GET", "/v1/health", None), ("POST", "/v1/wake", None), ("GET", "/v1/me", None),
        ("GET", "/v1/check?cluster=alpine", None), ("GET", "/v1/gpus", None), ("GET", "/v1/usage", None),
        ("GET", "/v1/queue", None), ("GET", "/v1/queue/all", None), ("GET", "/v1/clusters/alpine", None),
        ("GET", "/v1/jobs", None), ("GET", "/v1/jobs?owner=bob&name=bobs", None),
        ("GET", f"/v1/jobs/{job}", None), ("GET", "/v1/jobs/bobs-job", None), ("GET", f"/v1/jobs/{job}/logs", None),
        ("POST", "/v1/cancel", {"jobs": [job]}), ("POST", "/v1/cancel", {"jobs": ["bobs-job"]}),
        ("POST", "/v1/cancel", {"all": True}), ("POST", "/v1/cancel", {"all": True, "all_users": True}),
        ("GET", "/v1/managed", None), ("GET", "/v1/managed?all=true", None), ("GET", f"/v1/managed/{managed}", None),
        ("GET", f"/v1/managed/{managed}/attempts/1/logs", None), ("GET", f"/v1/managed/{managed}/why", None),
        ("POST", "/v1/managed/cancel", {"jobs": [managed]}), ("POST", "/v1/managed/cancel", {"all": True}),
        ("POST", "/v1/managed/cancel", {"all": True, "all_users": True}),
        ("GET", f"/v1/uploads/{upload}", None),
        ("PUT", f"/v1/uploads/{upload}", None),  # no body: refused, and bob's copy untouched
        ("GET", "/v1/dev", None), ("GET", "/v1/dev?name=box", None),
        ("POST", "/v1/dev/box/exec", {"task": {"run": "hostname"}}), ("GET", "/v1/dev/box/ssh", None),
        ("DELETE", "/v1/dev/box", None), ("DELETE", "/v1/dev", None),
        ("PATCH", "/v1/dev", {"idle_minutes": 0.1, "names": ["box"]}),  # `corral autostop box -i 0.1`
        ("GET", "/v1/users", None), ("POST", "/v1/users", {"name": "mallory", "role": "admin"}),
        ("DELETE", "/v1/users/bob", None), ("PATCH", "/v1/users/bob", {"unix_users": {"alpine": "mallory"}}),
        ("POST", "/v1/dashboard/link", None),
        ("POST", "/v1/launch", {"tasks": [{"run": "true"}], "dryrun": True}),
        ("POST", "/v1/managed", {"task": {"run": "true"}, "num_jobs": 0}),  # refused before anything is made
        ("POST", "/v1/dev/box", {"task": {"run": "true"}, "wait": False,
                                 "overrides": {"infra": "slurm/alpine/cpu", "cpus": "1"}}),
    ]
    published = {(method.upper(), path) for path, methods in json.loads(DOCS.read_text())["paths"].items()
                 for method in methods}
    walked = {(method, _template(path)) for method, path, _ in walks}
    assert published <= walked, f"routes not walked: {sorted(published - walked)}"

    for method, path, body in walks:
        status, _ = call(team, method, path, None, body)
        assert status == 401, (method, path, status)
    answers = {}
    for method, path, body in walks:
        status, text = call(team, method, path, alice, body)
        answers[(method, path)] = status
        assert status < 500, (method, path, status, text)
        asked = path + json.dumps(body)  # an error may echo what alice asked for; nothing else of bob's
        if (method, path) == ("POST", "/v1/dev/box"):  # her own new allocation: its Slurm id is hers, and
            asked += " ".join(_created_ids(text))  # may be the number one of bob's jobs has on another cluster
        leaked = [ref for ref in bobs if _mentions(text, ref) and ref not in asked]
        assert not leaked, (method, path, leaked, text[:500])
    for private in [f"/v1/jobs/{job}", f"/v1/jobs/{job}/logs", f"/v1/managed/{managed}", "/v1/dev/box/exec"]:
        assert answers[("GET" if "exec" not in private else "POST", private)] == 404, private
    assert answers[("PATCH", "/v1/dev")] == 404  # she has no box (yet): bob's is not hers to change
    assert answers[("GET", "/v1/users")] == answers[("POST", "/v1/users")] == answers[("DELETE", "/v1/users/bob")] \
        == answers[("PATCH", "/v1/users/bob")] == 403
    assert answers[("GET", "/v1/dev/box/ssh")] == 403
    assert answers[("POST", "/v1/cancel")] == answers[("POST", "/v1/managed/cancel")] == 403  # the all_users walks

    # alice's own "box" is hers: another allocation, not bob's
    mine = Client(team, alice).dev_status(["box"])
    assert [a["owner"] for a in mine] == ["alice"] and mine[0]["slurm_job_id"] != box["slurm_job_id"]
    assert Client(team, alice).dev_down("box")

    # bob's objects are as they were
    assert as_bob.job(job).state in ("PENDING", "RUNNING")
    assert as_bob.managed_job(managed)["state"] not in ("CANCELLING", "CANCELLED")
    [still] = as_bob.dev_status(["box"])
    assert (still["owner"], still["slurm_job_id"], still["idle_limit_seconds"]) == ("bob", box["slurm_job_id"], None)
    assert {u["name"]: u["unix_users"] for u in Client().users()} == {"alice": {}, "bob": {}}
    # the admin sees everyone's, but "all" is their own unless they ask for every user's, as `sky cancel -u`
    assert {j.job_id for j in Client().queue().jobs} >= {job}
    assert Client().cancel(all=True) == [] and Client().managed_cancel(all=True) == []
    assert as_bob.job(job).state in ("PENDING", "RUNNING")
    assert {o.job_id: o.cancelled for o in Client().cancel(all=True, all_users=True)}.get(job) is True
    with pytest.raises(ApiError) as not_hers:
        Client(team, alice).managed_cancel([managed])
    assert not_hers.value.status == 404
    as_bob.managed_cancel([managed])
    as_bob.dev_down("box")


def _created_ids(stream: str) -> list[str]:
    """The Slurm job ids in a launch stream's `done` events (JSON lines)."""
    events = [json.loads(line) for line in stream.splitlines() if line.startswith("{")]
    return [f'"{event["slurm_job_id"]}"' for event in events
            if event.get("event") == "done" and event.get("slurm_job_id")]


def _mentions(text: str, ref: str) -> bool:
    """Does an answer carry this id or name? A Slurm job id is a short number on a fresh cluster ("4"),
    so it counts only as a JSON or quoted string, not as any digit in, say, a tick count."""
    if ref.replace("_", "").isdigit():
        return f'"{ref}"' in text or f"'{ref}'" in text
    return ref in text


def _template(path: str) -> str:
    """The published route a walked path stands for."""
    path = path.split("?")[0]
    parts = path.split("/")
    names = {2: {"jobs": "{job}", "managed": "{job}", "dev": "{name}", "users": "{name}", "uploads": "{digest}",
                 "clusters": "{name}"}}
    out = []
    for i, part in enumerate(parts):
        if i == 3 and parts[2] in names[2] and part not in ("cancel", "all"):
            out.append(names[2][parts[2]])
        elif i == 5 and parts[2] == "managed" and parts[4] == "attempts":
            out.append("{number}")
        else:
            out.append(part)
    return "/".join(out)


def test_replicas_on_one_postgresql_split_the_clusters_and_hand_over_a_dead_ones(corral, corral_env,
                                                                                 fresh_postgres, clean_queues,
                                                                                 tmp_path):
    """Every replica answers every user; the clusters are split between the replicas, each held (and
    its jobs driven) by one; a third replica gets its share; kill -9 the one holding alpine and another
    takes alpine within one lease period and a tick, the job there driven to its end exactly once."""
    import math
    import os
    import signal
    import time
    from concurrent.futures import ThreadPoolExecutor

    from corral.client import Client as EngineClient
    from tests.helpers import ssh_login

    configured = EngineClient().registry.names()
    fast = {"CORRAL_CONTROLLER_INTERVAL": "1", "CORRAL_CONTROLLER_LEASE_SECONDS": "5"}
    replicas: dict[int, tuple[dict[str, str], str]] = {}  # pid -> (its environment, its URL)

    def start(name: str) -> int:
        env = {**corral_env, **fast, "CORRAL_HOME": str(tmp_path / name)}
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text("submit_as: service\n")  # one account for everyone
        port = free_port()
        started = corral("server", "start", "--host", "127.0.0.1", "--port", str(port), "--db", fresh_postgres,
                         env=env)
        assert started.exit_code == 0, started.stderr
        pid = json.loads((tmp_path / name / "controller.json").read_text())["pid"]
        replicas[pid] = (env, f"http://127.0.0.1:{port}")
        return pid

    def holders(asked: Client) -> dict[str, int]:
        """cluster -> the pid of the replica holding it."""
        return {c: int(h.rsplit(":", 1)[1]) for c, h in asked.health()["shards"]["clusters"].items()}

    def split_between(asked: Client, pids: set[int]) -> dict[str, int] | None:
        held = holders(asked)
        counts = [list(held.values()).count(pid) for pid in pids]
        return held if (set(held) == set(configured) and set(held.values()) == pids
                        and max(counts) <= math.ceil(len(configured) / len(pids))) else None

    for name in ("one", "two"):
        start(name)
    try:
        first_env = next(iter(replicas.values()))[0]
        token = add_user(lambda *a: corral(*a, env=first_env), "ada")  # added through one replica...
        clients = {pid: Client(url, token) for pid, (_, url) in replicas.items()}
        assert {c.me()["name"] for c in clients.values()} == {"ada"}  # ...known to both: the API works on each
        any_client = next(iter(clients.values()))
        wait_for("two replicas to split the clusters", lambda: split_between(any_client, set(replicas)), timeout=30)
        # One dev allocation name launched through both replicas at the same moment: they take turns (a
        # lock in the store, not on one machine), and the second reuses the first's allocation.
        with ThreadPoolExecutor(len(clients)) as pool:
            answers = list(pool.map(lambda c: c.dev_launch("race", infra="slurm/alpine/cpu", cpus="1", wait=False),
                                    clients.values()))
        assert len({a["slurm_job_id"] for a in answers}) == 1, answers
        assert sorted(a["new"] for a in answers) == [False, True]
        assert any_client.dev_down("race")
        third = start("three")
        clients[third] = Client(replicas[third][1], token)
        held = wait_for("three replicas to split the clusters",
                        lambda: split_between(clients[third], set(replicas)), timeout=30)
        driver = held["alpine"]
        other = next(pid for pid in replicas if pid != driver)
        out = f"replicas-{os.getpid()}"
        # recorded through a replica that does not hold alpine: alpine's holder drives it from the shared store
        [job] = clients[other].managed_launch(command=f'echo "$CORRAL_ATTEMPT" >> ~/{out}; sleep 15',
                                              infra="slurm/alpine/cpu", cpus="1")
        wait_for("alpine's holder to start it", lambda: clients[other].managed_job(job)["state"] == "RUNNING",
                 timeout=60)
        os.kill(driver, signal.SIGKILL)
        killed_at = time.monotonic()
        survivors = set(replicas) - {driver}
        wait_for("another replica to take alpine", lambda: holders(clients[other]).get("alpine") in survivors,
                 timeout=20, interval=0.1)
        took = time.monotonic() - killed_at
        print(f"alpine taken over {took:.1f} s after the kill")
        assert took <= 5 + 2, took  # one lease period, plus a tick
        wait_for("the survivors to split every cluster", lambda: split_between(clients[other], survivors), timeout=20)
        done = wait_for("the job to end", lambda: (j := clients[other].managed_job(job))["state"] in
                        ("SUCCEEDED", "FAILED", "CANCELLED") and j, timeout=90)
        assert done["state"] == "SUCCEEDED" and len(done["attempt_list"]) == 1  # driven on, never resubmitted
        assert ssh_login(corral_env["CORRAL_SLURM_CONFIG"], "alpine", f"cat {out}; rm -f {out}").split() == ["1"]
    finally:
        for env, _ in replicas.values():
            corral("server", "stop", env=env)


def test_replicas_that_read_different_clusters_files_drive_nothing_and_server_status_says_why(
        corral, corral_env, fresh_postgres, tmp_path, browser):
    """A second replica reads the same clusters in another order (its own copy of the clusters file):
    both stop driving, `corral server status` and the dashboard on either say why, and once it stops
    the first one holds every cluster again."""
    import re

    from corral.client import Client as EngineClient

    configured = EngineClient().registry.names()
    head, *hosts = re.split(r"(?m)^(?=Host )", Path(corral_env["CORRAL_SLURM_CONFIG"]).read_text())
    reordered = tmp_path / "reordered-clusters"
    reordered.write_text(head + "".join(h.rstrip("\n") + "\n\n" for h in reversed(hosts)))
    fast = {"CORRAL_CONTROLLER_INTERVAL": "1", "CORRAL_CONTROLLER_LEASE_SECONDS": "5"}
    envs = {}
    for name, clusters_file in (("one", corral_env["CORRAL_SLURM_CONFIG"]), ("two", str(reordered))):
        envs[name] = {**corral_env, **fast, "CORRAL_HOME": str(tmp_path / name), "CORRAL_SLURM_CONFIG": clusters_file}
        (tmp_path / name).mkdir()
        started = corral("server", "start", "--host", "127.0.0.1", "--port", str(free_port()), "--db",
                         fresh_postgres, env=envs[name])
        assert started.exit_code == 0, started.stderr

    def status(name: str) -> dict:
        return json.loads(corral("server", "status", "--json", env=envs[name]).stdout)

    try:
        both = wait_for("both replicas to see they disagree", lambda: all(
            ((status(n).get("last_tick") or {}).get("disagreement") or "").startswith("replicas read different")
            for n in envs) and [status(n) for n in envs], timeout=30)
        assert all(s["shards"]["clusters"] == {} for s in both)  # no cluster held, by either
        assert len(set(both[0]["shards"]["cluster_lists"].values())) == 2
        shown = corral("server", "status", env=envs["one"]).stdout
        assert "drives nothing: replicas read different cluster lists (this one, " in shown
        assert f"reads {len(configured)} clusters, digest " in shown and "same clusters file" in shown
        context, page, _ = logged_in(browser, corral, envs["one"])
        banner = page.locator("#engine")
        banner.wait_for(state="visible", timeout=15_000)
        assert banner.text_content().startswith("This server drives no jobs: replicas read different cluster lists")
        corral("server", "stop", env=envs["two"])
        wait_for("the first replica to hold every cluster again",
                 lambda: set(status("one")["shards"]["clusters"]) == set(configured)
                 and not status("one")["last_tick"]["disagreement"], timeout=20)
        page.reload()
        page.wait_for_selector("#engine[data-checked-at]", state="attached", timeout=30_000)
        assert banner.is_hidden()
        context.close()
    finally:
        for env in envs.values():
            corral("server", "stop", env=env)


def _self_signed(where: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as a small site's own CA would issue."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = where / "tls.crt", where / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_file.chmod(0o600)
    return cert_file, key_file


def test_a_team_server_over_https(corral, corral_env, tmp_path):
    """--tls-cert/--tls-key: the server's own CLI trusts exactly its certificate; a member trusts it
    through SSL_CERT_FILE (a private CA), and without it gets a clear refusal, not a traceback."""
    cert, key = _self_signed(tmp_path)
    port = free_port()
    started = corral("server", "start", "--host", "127.0.0.1", "--port", str(port), "--tls-cert", str(cert),
                     "--tls-key", str(key))
    assert started.exit_code == 0, started.stderr
    assert f"at https://127.0.0.1:{port}" in started.stdout, started.stdout
    url = f"https://127.0.0.1:{port}"
    token = add_user(corral, "alice")  # the admin, over HTTPS with the pinned certificate
    member = {**corral_env, "CORRAL_HOME": str(tmp_path / "alice-home")}
    untrusted = corral("api", "login", url, "--token", token, env=member)
    assert untrusted.exit_code != 0 and "Traceback" not in untrusted.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr, untrusted.stderr
    trusted = {**member, "SSL_CERT_FILE": str(cert)}
    login = corral("api", "login", url, "--token", token, env=trusted)
    assert login.exit_code == 0 and "as alice (user" in login.stdout, login.stderr
    assert corral("queue", "--json", env=trusted).json() == []
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=10).read()
    corral("server", "stop")


def test_single_sign_on_through_the_servers_own_socket(corral, corral_env, tmp_path):
    """--sso-header: a request from the proxy's address (loopback by default) that names a registered
    person in the header is theirs; a name the server does not know, or a wrong token beside the
    header, is refused (a token always wins)."""
    port = free_port()
    started = corral("server", "start", "--host", "127.0.0.1", "--port", str(port),
                     "--sso-header", "X-Auth-Request-Email")
    assert started.exit_code == 0, started.stderr
    url = f"http://127.0.0.1:{port}"
    add_user(corral, "ada@example.org")

    def me(headers: dict[str, str]) -> tuple[int, str]:
        request = urllib.request.Request(url + "/v1/me", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())["name"]
        except urllib.error.HTTPError as exc:
            return exc.code, ""

    assert me({"X-Auth-Request-Email": "ada@example.org"}) == (200, "ada@example.org")
    assert me({"X-Auth-Request-Email": "eve@example.org"})[0] == 401
    assert me({"X-Auth-Request-Email": "ada@example.org", "Authorization": "Bearer corral_wrong"})[0] == 401
    assert me({})[0] == 401
    corral("server", "stop")
