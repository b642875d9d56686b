"""corral.sdk against a real server and the testbed: the same API the CLI uses, with typed results."""

from __future__ import annotations

import pytest

from corral.sdk import ApiError, Client, PlanRow


def test_the_sdk_launches_yaml_text_a_dict_and_a_file_and_waits_for_the_end(corral_env, clean_queues, tmp_path):
    client = Client()
    done = client.launch("name: sdk-yaml\nresources:\n  cpus: 1\nrun: echo from yaml\n", detach=False)
    assert [(j.name, j.state, j.exit_code) for j in done.ended] == [("sdk-yaml", "SUCCEEDED", 0)]
    assert b"".join(client.logs(done.job_id)) == b"from yaml\n"

    events: list[dict] = []
    sweep = client.launch({"run": "echo rank $CORRAL_JOB_RANK", "resources": {"cpus": 1}}, num_jobs=3,
                          on_event=events.append)
    assert len(sweep.job_ids) == 3 and len(set(sweep.job_ids)) == 3
    assert [e["step"] for e in events if e["event"] == "step"][:2] == ["probe", "plan"]
    assert sum(len(e["job_ids"]) for e in events if e["event"] == "submitted") == 3

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "hello.txt").write_text("from the workdir\n")
    task = tmp_path / "task.yaml"
    task.write_text("workdir: code\nresources:\n  infra: slurm/cirrus\nrun: cat hello.txt\n")
    [plan] = client.launch(task, dryrun=True, base=tmp_path)
    assert all(isinstance(row, PlanRow) for row in plan) and [r.cluster for r in plan if r.chosen] == ["cirrus"]
    ended = client.launch(task, base=tmp_path, detach=False).ended
    assert ended[0].state == "SUCCEEDED" and ended[0].cluster == "cirrus"
    assert b"".join(client.logs(ended[0].job_id)) == b"from the workdir\n"


def test_the_sdk_raises_the_servers_refusal_with_its_class_and_exit_code(corral_env):
    client = Client()
    with pytest.raises(ApiError) as refused:
        client.launch("resources:\n  acelerators: H100:1\nrun: echo\n")
    assert refused.value.status == 400 and refused.value.kind == "TaskError" and refused.value.exit_code == 65
    assert "resources.acelerators: unknown field; did you mean 'accelerators'?" in str(refused.value)
    with pytest.raises(ApiError) as impossible:
        client.launch({"run": "true", "resources": {"accelerators": "H100:64"}})
    assert impossible.value.kind == "NoFeasibleClusterError" and impossible.value.exit_code == 69
    with pytest.raises(ApiError) as unknown:
        client.job("c-nope")
    assert unknown.value.status == 404 and unknown.value.exit_code == 66


PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
                   "no_proxy", "NO_PROXY")


def test_a_remote_server_is_reached_through_the_users_proxy_and_the_local_one_never(corral_env, monkeypatch):
    """Many login nodes and laptops set http_proxy; urllib would send even 127.0.0.1 to it."""
    import http.client
    import http.server
    import threading
    import urllib.parse

    seen: list[str] = []

    class Forwarding(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append(self.path)  # a proxy is sent the absolute URL
            target = urllib.parse.urlsplit(self.path)
            upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
            upstream.request("GET", target.path, headers={"Authorization": self.headers["Authorization"]})
            answer = upstream.getresponse()
            body = answer.read()
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.getheader("Content-Type", "application/json"))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forwarding)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        local = Client()
        pid = local.health()["pid"]  # started before any proxy is set
        for name in PROXY_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{proxy.server_address[1]}")
        assert Client().health()["pid"] == pid and seen == []  # this machine's own server: never through it
        point = local.endpoint
        remote = Client(url=point.url, token=point.token)  # the same server, named as a remote one
        assert remote.health()["pid"] == pid and seen == ["/".join([point.url, "v1", "health"])]
    finally:
        proxy.shutdown()


def test_a_quiet_job_and_a_quiet_exec_are_followed_past_the_clients_timeout(corral_env, clean_queues):
    """The client's timeout bounds connecting and an answer's headers, not a job's silence: before, a
    followed job or an exec's command that printed nothing for 120 s ended the CLI with "the server
    stopped answering" (exit 69), and an exec with it."""
    Client().check(["alpine"])  # the server starts (and the cluster's connection opens) within the usual timeout
    client = Client(timeout=2)
    job = client.launch(command="echo before; sleep 5; echo after", infra="slurm/alpine").job_id
    assert b"".join(client.logs(job, follow=True)) == b"before\nafter\n"

    client.dev_launch("quiet", command=None, infra="slurm/alpine")
    output: list[bytes] = []
    _, status = client.dev_exec("quiet", command="echo before; sleep 5; echo after", on_output=output.append)
    assert (b"".join(output), status) == (b"before\nafter\n", 0)
    assert client.dev_down("quiet")
