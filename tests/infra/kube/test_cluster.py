"""KubeInfra's answers at the edges, against the fake API server (testbed/kubeapi.py) through the official
client: a retried submission makes no second Job, what the API refuses says why and leaves nothing
behind, the env values travel in a Secret that the run files' pass deletes once the job ended, and a
missing context, a wrong token or a silent server are clear errors."""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter

import pytest

from corral.config import KubeEntry
from corral.errors import ClusterError, ClusterUnreachableError, ConfigError
from corral.infra.base import EndedRun, JobRequest, JobState, new_token
from corral.infra.kube import cluster as kube_cluster
from corral.infra.kube.cluster import KubeInfra
from tests.conftest import wait_for


def infra(kube, **overrides) -> KubeInfra:
    entry = KubeEntry(overrides.pop("context", kube.context), str(overrides.pop("kubeconfig", kube.kubeconfig)))
    return KubeInfra(entry, Counter(), timeout=3)


def request(**overrides) -> JobRequest:
    base = dict(token=new_token(), task_ids=("c-kubetest0001",), place="kind-fake", num_nodes=1,
                accelerator_type=None, accelerators_per_node=0, cpus_per_node=1, memory_mb=None, envs={},
                setup=None, run="sleep 30")
    base.update(overrides)
    return JobRequest(**base)


def objects(kube, kind: str, token: str) -> list[dict]:
    path = {"jobs": "/apis/batch/v1/namespaces/default/jobs",
            "configmaps": "/api/v1/namespaces/default/configmaps", "secrets": "/api/v1/namespaces/default/secrets",
            "services": "/api/v1/namespaces/default/services"}[kind]
    return kube.request("GET", f"{path}?labelSelector=corral.dev/token={token}")["items"]


def test_a_retried_submission_finds_its_job(kube):
    backend = infra(kube)
    asked = request()
    first = asyncio.run(backend.submit(asked))
    again = asyncio.run(infra(kube).submit(asked))
    try:
        assert (first.accepted, first.already_existed) == (True, False)
        assert (again.accepted, again.already_existed, again.handle) == (True, True, first.handle)
        assert len(objects(kube, "jobs", asked.token)) == 1
        status = asyncio.run(backend.status([first.handle]))
        assert [s.state for s in status if s.handle == first.handle] in ([JobState.PENDING], [JobState.RUNNING])
    finally:
        asyncio.run(backend.cancel([first.handle], [""]))
    assert objects(kube, "jobs", asked.token) == [] and objects(kube, "configmaps", asked.token) == []
    assert objects(kube, "secrets", asked.token) == []


def test_what_the_api_refuses_says_why_and_leaves_nothing(kube):
    asked = request(scheduler_options={"pod_config": {"spec": {"containers": [
        {"resources": {"requests": {"cpu": "lots"}}}]}}})
    answer = asyncio.run(infra(kube).submit(asked))
    assert not answer.accepted
    assert "the API answered 422" in answer.message and "lots" in answer.message
    assert objects(kube, "configmaps", asked.token) == [] and objects(kube, "secrets", asked.token) == []


def test_a_role_that_may_not_create_secrets_is_refused_with_what_to_grant_and_leaves_nothing(kube):
    """An older Role allowed ConfigMaps but no Secrets: the submission is refused (not an unreachable
    cluster), says which rights Corral needs, and the ConfigMap made beside it is deleted."""
    kube.forbid("secrets")
    try:
        asked = request()
        answer = asyncio.run(infra(kube).submit(asked))
    finally:
        kube.forbid("secrets", False)
    assert not answer.accepted and "the API answered 403: secrets is forbidden" in answer.message
    assert "Corral needs create, patch, delete and deletecollection on secrets in namespace default" in answer.message
    assert objects(kube, "configmaps", asked.token) == [] and objects(kube, "jobs", asked.token) == []


def test_a_workdir_too_large_for_a_config_map_is_refused_before_anything_is_created(kube, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(__import__("os").urandom(1_200_000))
    backend = infra(kube)
    asked = request()
    asyncio.run(backend.upload(big, f".corral/runs/{asked.token}/workdir/big.bin"))
    answer = asyncio.run(backend.submit(asked))
    assert not answer.accepted and "a ConfigMap holds at most 1 MiB" in answer.message
    assert "pod_config" in answer.message and objects(kube, "configmaps", asked.token) == []


def test_a_workdir_of_many_mb_is_refused_without_packing_it_whole(kube, tmp_path):
    """Packing stops once the archive is past what a ConfigMap holds: refusing a 64 MB workdir costs a few
    MB (the client's first loads included), not the whole packed workdir and its base64 (257 MB before)."""
    import os
    import tracemalloc

    work = tmp_path / "work"
    work.mkdir()
    for i in range(4):
        (work / f"shard-{i}.bin").write_bytes(os.urandom(16 * 2**20))
    backend = infra(kube)
    asked = request()
    asyncio.run(backend.upload(work, f".corral/runs/{asked.token}/workdir/"))
    tracemalloc.start()
    try:
        answer = asyncio.run(backend.submit(asked))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not answer.accepted and "more than 1000 kB packed; a ConfigMap holds at most 1 MiB" in answer.message
    assert peak < 32 * 2**20, peak
    assert objects(kube, "configmaps", asked.token) == []


def test_files_outside_a_run_folder_go_with_the_submission_they_name_and_no_other(kube, tmp_path):
    """Two launches at once to one context, each with a file for the home (a `~/…` file mount, a
    recovered job's checkpoint): each ConfigMap holds its own file only. A file that names no
    submission is refused, never handed to whichever comes next."""
    import io
    import tarfile

    backend = infra(kube)
    first, second = request(), request()
    for asked, text in ((first, "mine"), (second, "theirs")):
        (tmp_path / text).write_text(text)
        asyncio.run(backend.upload(tmp_path / text, f"data/{text}.txt", asked.token))

    async def both():
        return await asyncio.gather(backend.submit(second), backend.submit(first))

    answers = asyncio.run(both())
    try:
        assert all(a.accepted for a in answers)
        for asked, text in ((first, "mine"), (second, "theirs")):
            [cm] = objects(kube, "configmaps", asked.token)
            packed = base64.b64decode(cm["binaryData"]["home.tar.gz"])
            with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
                assert tar.getnames() == [f"data/{text}.txt"]
    finally:
        asyncio.run(backend.cancel([a.handle for a in answers], ["", ""]))
    with pytest.raises(ValueError, match="names no attempt to go with"):
        asyncio.run(backend.upload(tmp_path / "mine", "data/orphan.txt"))


def test_an_unknown_context_names_the_ones_there_are(kube):
    with pytest.raises(ConfigError, match="no context 'nope' in the kubeconfig.*its contexts: kind-fake"):
        asyncio.run(infra(kube, context="nope").probe())


def test_a_missing_kubeconfig_is_a_config_error(kube, tmp_path):
    with pytest.raises(ConfigError, match="cannot load the kubeconfig"):
        asyncio.run(infra(kube, kubeconfig=tmp_path / "absent").probe())


def test_a_wrong_token_and_a_silent_server(kube, tmp_path):
    config = json.loads(kube.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = "wrong"
    wrong = tmp_path / "wrong-token"
    wrong.write_text(json.dumps(config))
    with pytest.raises(ClusterError, match="the API answered 401: Unauthorized"):
        asyncio.run(infra(kube, kubeconfig=wrong).probe())
    config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"  # discard: nothing listens
    silent = tmp_path / "silent"
    silent.write_text(json.dumps(config))
    with pytest.raises(ClusterUnreachableError,
                       match=r"the API server at http://127.0.0.1:9 does not answer: connection refused$"):
        asyncio.run(infra(kube, kubeconfig=silent).probe())


def test_a_failed_request_is_told_in_a_few_words_whatever_urllib3_wraps_it_in():
    """It was urllib3's whole message: `HTTPConnectionPool(host=…): Max retries exceeded with url: … (Caused
    by NewConnectionError(…))`, some 300 characters, cut in the middle."""
    import socket
    import threading

    import urllib3

    def failure(url: str) -> Exception:
        try:
            urllib3.PoolManager(retries=0, timeout=urllib3.Timeout(connect=2, read=0.3)).request("GET", url)
        except Exception as exc:
            return exc
        raise AssertionError(f"{url} answered")

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = closed.getsockname()[1]
    with socket.socket() as silent, socket.socket() as garbled:
        for listener in (silent, garbled):
            listener.bind(("127.0.0.1", 0))
            listener.listen()

        def answer_garbage() -> None:
            conn, _ = garbled.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"not TLS\r\n\r\n")

        threading.Thread(target=answer_garbage, daemon=True).start()
        assert kube_cluster.why_unanswered(failure(f"http://127.0.0.1:{refused}/")) == "connection refused"
        assert kube_cluster.why_unanswered(failure(f"http://127.0.0.1:{silent.getsockname()[1]}/")) == "timed out"
        assert kube_cluster.why_unanswered(failure(f"https://127.0.0.1:{garbled.getsockname()[1]}/")) == (
            "TLS: wrong version number")
    assert kube_cluster.why_unanswered(ValueError("odd\n  thing")) == "odd thing"


def test_the_service_and_config_map_belong_to_the_job(kube):
    backend = infra(kube)
    asked = request(run="true")
    submitted = asyncio.run(backend.submit(asked))
    assert submitted.accepted, submitted.message
    [config] = objects(kube, "configmaps", asked.token)
    [job] = objects(kube, "jobs", asked.token)
    assert config["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    service = kube.request("GET", f"/api/v1/namespaces/default/services/{submitted.handle}")
    assert service["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    # Deleting the Job alone (as Kubernetes' TTL controller does once it ended) takes them with it.
    kube.request("DELETE", f"/apis/batch/v1/namespaces/default/jobs/{submitted.handle}")
    assert objects(kube, "configmaps", asked.token) == []


def test_once_the_watches_are_synced_a_status_query_makes_no_request(kube):
    backend = infra(kube)
    asked = request(run="sleep 2")
    submitted = asyncio.run(backend.submit(asked))
    assert submitted.accepted, submitted.message
    # Until the watches have shown the new Job, a status query lists (it never answers with less).
    wait_for("the watches to show the new Job", lambda: backend._watch().synced and submitted.handle in {
        j["metadata"]["name"] for j in backend._watch().snapshot()["jobs"]}, timeout=10)
    before = len(kube.requests())
    seen = []

    def ended() -> bool:
        [mine] = [s for s in asyncio.run(backend.status([submitted.handle])) if s.handle == submitted.handle]
        seen.append(mine.state)
        return mine.state is JobState.SUCCEEDED

    wait_for("the job to end, as the watches tell", ended, timeout=20)
    asked_for = [r for r in kube.requests()[before:] if "watch" not in r]
    # No list of Jobs or pods: at most the Warning events while a pod was pending.
    assert [r for r in asked_for if not r.endswith("/events")] == [], asked_for
    assert JobState.RUNNING in seen or JobState.PENDING in seen


def ended(backend: KubeInfra, handles: list[str]) -> None:
    wait_for("the jobs to end", lambda: {s.handle: s.state for s in asyncio.run(backend.status(handles))
                                         if s.handle in handles} == dict.fromkeys(handles, JobState.SUCCEEDED), 30)


def test_the_env_values_travel_in_a_secret_that_belongs_to_the_job(kube):
    """Not in the ConfigMap (which Kubernetes' `view` role may read): in a Secret the pod mounts, owned
    by the Job like the rest, so a Job deleted by its TTL takes it along."""
    backend = infra(kube)
    asked = request(envs={"TOKEN": "s3cret-value"}, run='echo "got $TOKEN"')
    submitted = asyncio.run(backend.submit(asked))
    assert submitted.accepted, submitted.message
    [config] = objects(kube, "configmaps", asked.token)
    assert "s3cret" not in json.dumps(config) and "env.sh" not in config["data"]
    [secret] = objects(kube, "secrets", asked.token)
    assert "s3cret-value" in base64.b64decode(secret["data"]["env.sh"]).decode()
    [job] = objects(kube, "jobs", asked.token)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    ended(backend, [submitted.handle])
    out: list[bytes] = []
    asyncio.run(backend.logs(submitted.handle, "", False, out.append))
    assert b"".join(out) == b"got s3cret-value\n"
    kube.request("DELETE", f"/apis/batch/v1/namespaces/default/jobs/{submitted.handle}")
    assert objects(kube, "secrets", asked.token) == []


def test_a_pods_log_read_for_a_client_that_stops_reading_waits_and_ends_when_the_client_goes(kube):
    """The log is read by a thread of its own. For a client that stops reading (pacing.OUTPUT_PACE never
    has room), the thread hands on one chunk and waits; once the reader is cancelled (the client went
    away), the thread ends instead of reading the rest into a stream nobody reads."""
    from corral import pacing

    backend = infra(kube)
    asked = request(run="head -c 20000000 /dev/zero | tr '\\0' x")
    submitted = asyncio.run(backend.submit(asked))
    ended(backend, [submitted.handle])
    out: list[bytes] = []

    async def scenario() -> None:
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))  # the reading thread is the only one
        pacing.OUTPUT_PACE.set(asyncio.Event().wait)  # never any room
        reading = asyncio.ensure_future(backend.logs(submitted.handle, "", False, out.append))
        for _ in range(200):
            if out:
                break
            await asyncio.sleep(0.05)
        for _ in range(10):  # a while more: nothing more comes
            await asyncio.sleep(0.05)
        assert len(out) == 1 and len(out[0]) <= 65536
        reading.cancel()
        # Free again once the reading thread has ended: work given to it now runs.
        assert await asyncio.wait_for(loop.run_in_executor(None, lambda: "free"), 10) == "free"

    asyncio.run(scenario())


def test_followed_logs_hold_no_shared_thread_and_free_their_own_as_soon_as_the_client_goes(kube):
    """A followed log is read for as long as its pod runs, on a thread of its own: on the loop's default
    executor (6 threads on two cores) six followed logs held every other API call waiting (here one
    thread stands for it, and one followed log held it). A followed read of a pod that writes nothing
    more blocks in the socket, where no flag reaches it: once the reader is cancelled, the response's
    socket is shut, so the thread (and its API connection) is freed at once, not when the pod next
    writes or ends (here in 120 s)."""
    import threading

    backend = infra(kube)
    submitted = [asyncio.run(backend.submit(request(run=f"echo started {n}; sleep 120"))) for n in range(2)]
    out: list[bytes] = []

    def readers() -> int:
        return sum(t.name == "corral-kube-log" and t.is_alive() for t in threading.enumerate())

    try:
        async def scenario() -> None:
            from concurrent.futures import ThreadPoolExecutor

            loop = asyncio.get_running_loop()
            loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
            reading = [asyncio.ensure_future(backend.logs(s.handle, "", True, out.append)) for s in submitted]
            for _ in range(400):
                if all(f"started {n}".encode() in b"".join(out) for n in range(2)):
                    break
                await asyncio.sleep(0.05)
            assert all(f"started {n}".encode() in b"".join(out) for n in range(2)), out
            assert await asyncio.wait_for(loop.run_in_executor(None, lambda: "free"), 10) == "free"
            assert readers() == 2
            for read in reading:
                read.cancel()
            for _ in range(200):
                if not readers():
                    break
                await asyncio.sleep(0.05)
            assert readers() == 0

        asyncio.run(scenario())
    finally:
        asyncio.run(backend.cancel([s.handle for s in submitted], []))


def test_a_log_of_several_pods_labels_each_line_with_its_rank_newest_pod_first(monkeypatch):
    """Each completion index's newest pod is read (a failed one replaced keeps the index), rank 0's
    first without --follow, each line after its rank as srun --label writes it; followed, a pod still
    pending is waited for. The fake API server replaces no pods and holds none pending on demand: the
    pod list and the reads stand in for it."""
    backend = KubeInfra(KubeEntry("kind-x", "/nonexistent"), Counter(), timeout=3)
    backend._api = object()  # no API client: _list and _stream_log stand in for the API server

    def pod(name: str, index: int, created: str, phase: str = "Running") -> dict:
        return {"metadata": {"name": name, "creationTimestamp": created,
                             "labels": {"batch.kubernetes.io/job-completion-index": str(index)}},
                "status": {"phase": phase}}

    listed = [pod("j-1-new", 1, "2026-12-07T10:05:00Z"), pod("j-0", 0, "2026-12-07T10:00:00Z"),
              pod("j-1-old", 1, "2026-12-07T10:00:00Z", "Failed")]

    async def listing(path, **query):
        return listed

    said = {"j-0": b"epoch 1\nepoch 2", "j-1-new": b"ready\n", "j-1-old": b"crashed\n"}
    backend._list = listing  # type: ignore[method-assign]
    backend._stream_log = (  # type: ignore[method-assign]
        lambda ns, name, follow, sink, reading, tail=0: sink(said[name]))
    out: list[bytes] = []
    asyncio.run(backend.logs("j", "", False, out.append))
    assert b"".join(out) == b"0: epoch 1\n0: epoch 2\n1: ready\n"

    # Followed: a worker still pending once the head runs is waited for, not read (and missed) at once.
    monkeypatch.setattr(kube_cluster, "LOG_POLL_SECONDS", 0.01)
    pending = pod("j-1-new", 1, "2026-12-07T10:05:00Z", "Pending")
    listed[0] = pending
    asked: list[dict] = []

    async def listing_by_name(path, **query):
        if "fieldSelector" in query:  # the pending pod asked after: it has started
            asked.append(query)
            return [pod("j-1-new", 1, "2026-12-07T10:05:00Z")]
        return listed

    backend._list = listing_by_name  # type: ignore[method-assign]
    followed: list[tuple[str, bool]] = []
    backend._stream_log = (  # type: ignore[method-assign]
        lambda ns, name, follow, sink, reading, tail=0: (followed.append((name, follow)), sink(said[name])))
    out.clear()
    asyncio.run(backend.logs("j", "", True, out.append))
    assert sorted(followed) == [("j-0", True), ("j-1-new", True)]
    assert asked == [{"fieldSelector": "metadata.name=j-1-new"}]
    assert sorted(b"".join(out).splitlines()) == [b"0: epoch 1", b"0: epoch 2", b"1: ready"]


def test_the_run_files_pass_deletes_ended_attempts_secrets_and_config_maps(kube, monkeypatch):
    """remove_env_files: the Secrets and ConfigMaps, one request per kind (a delete of the collection
    the tokens' label selects); the Jobs, and so their logs, stay until their TTL. remove_run_dirs: the
    same. Gone already is no error; what is not a token is refused before any request."""
    backend = infra(kube)
    asked = [request(envs={"TOKEN": "x"}, run="echo kept") for _ in range(3)]
    handles = [asyncio.run(backend.submit(a)).handle for a in asked]
    ended(backend, handles)
    runs = [EndedRun(f".corral/runs/{a.token}", h) for a, h in zip(asked, handles)]

    def deletes(since: int) -> list[str]:
        return sorted(r for r in kube.requests()[since:] if r.startswith("DELETE"))

    before = len(kube.requests())
    asyncio.run(backend.remove_env_files(runs[:2]))
    assert deletes(before) == ["DELETE /api/v1/namespaces/default/configmaps", "DELETE /api/v1/namespaces/default/secrets"]
    for kind, left in (("secrets", [0, 0, 1]), ("configmaps", [0, 0, 1]), ("jobs", [1, 1, 1])):
        assert [len(objects(kube, kind, a.token)) for a in asked] == left, kind
    out: list[bytes] = []
    asyncio.run(backend.logs(handles[0], "", False, out.append))
    assert b"".join(out) == b"kept\n"
    asyncio.run(backend.remove_run_dirs(runs[:2]))  # gone already: no error
    monkeypatch.setattr(kube_cluster, "SELECTED_AT_ONCE", 1)
    before = len(kube.requests())
    asyncio.run(backend.remove_run_dirs(runs))
    assert deletes(before) == 3 * ["DELETE /api/v1/namespaces/default/configmaps"] + 3 * [
        "DELETE /api/v1/namespaces/default/secrets"]
    assert objects(kube, "secrets", asked[2].token) == [] and len(objects(kube, "jobs", asked[2].token)) == 1
    before = len(kube.requests())
    with pytest.raises(ValueError, match="not an attempt token"):
        asyncio.run(backend.remove_env_files([runs[2], EndedRun(".corral/runs/x),(y", None)]))
    assert deletes(before) == []
    asyncio.run(backend.cancel(handles, [""] * 3))
    assert [objects(kube, "jobs", a.token) for a in asked] == [[], [], []]


def test_check_reviews_the_rbac_rights_and_names_what_is_missing(kube):
    """`corral check`'s probe (associations) adds one rules review beside the lists; a role without
    secrets or pods/log is told what fails and what to grant, each right the rules do not show
    confirmed by an access review; a plain probe reviews nothing."""
    def reviews_during(call) -> tuple[object, list[str]]:
        before = len(kube.requests())
        result = call()
        return result, [r.split("/")[-1] for r in kube.requests()[before:] if "authorization.k8s.io" in r]

    snap, asked = reviews_during(lambda: asyncio.run(infra(kube).probe(associations=True)))
    assert snap.warnings == () and asked == ["selfsubjectrulesreviews"]
    _, asked = reviews_during(lambda: asyncio.run(infra(kube).probe()))
    assert asked == []
    kube.forbid("secrets")
    kube.forbid("pods/log")
    try:
        snap, asked = reviews_during(lambda: asyncio.run(infra(kube).probe(associations=True)))
    finally:
        kube.forbid("secrets", False)
        kube.forbid("pods/log", False)
    assert asked == ["selfsubjectrulesreviews"] + ["selfsubjectaccessreviews"] * 5  # 4 verbs on secrets, 1 on the log
    assert [w.split(":")[0] for w in snap.warnings] == [
        "your kubeconfig's user may not create, patch, delete, deletecollection secrets in namespace default",
        "your kubeconfig's user may not get pods/log in namespace default"]
    assert snap.nodes  # the capacity all the same


def test_a_log_the_api_server_stops_sending_midway_is_an_unreachable_cluster_not_a_crash():
    """A real API server that goes away mid-stream cuts its chunked answer short: urllib3 raises its own
    error, which reached the API's stream as a bug (a traceback in the server's log, and "the server
    stopped answering" for the client). The fake API server cannot do this on demand: it ends its
    answers cleanly, so a response that raises stands in for it."""
    from urllib3.exceptions import ProtocolError

    backend = KubeInfra(KubeEntry("kind-x", "/nonexistent"), Counter(), timeout=3)

    class CutShort:
        status = 200

        def stream(self, size):
            yield b"epoch 1\n"
            raise ProtocolError("Response ended prematurely")

        def release_conn(self):
            pass

    backend._send = lambda *args, **kw: CutShort()  # type: ignore[method-assign]
    out: list[bytes] = []
    with pytest.raises(ClusterUnreachableError, match="^kind-x: the API server stopped sending the log"):
        backend._stream_log("default", "pod-0", True, out.append, kube_cluster._LogRead())
    assert out == [b"epoch 1\n"]
