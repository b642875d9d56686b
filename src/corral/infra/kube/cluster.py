"""KubeInfra: one Kubernetes context behind the Infra seam (`k8s/<context>`), through the official
`kubernetes` client (its blocking calls in worker threads; lists as raw JSON, parsed by the pure
modules here).

Cost per call, in API requests (each counted as a round trip of the context, requests of one call
going out together):
- probe: nodes and pods (every namespace), in parallel: one round trip; `corral check`'s adds an RBAC
  rules review alongside, and an access review per right the rules do not show (rbac.py);
- submit: the ConfigMap and the Secret (env.sh) together, then the Job (409: it exists, the retried
  submission found it, and reads it), then the Service and the ConfigMap's and Secret's owner (the
  Job, so that all three go with it) together: six or seven requests in three or four steps; the Job
  is found again by name, which is its token's;
- status: Corral's Jobs and pods in the namespace, as watches keep them (`watch.py`): no request once
  synced, plus the Warning events when a pod is pending; before that, or for a job the watches have
  not shown yet, both listed together: one or two round trips, whatever the number of jobs;
- cancel: delete each Job (its pods with it), Service, ConfigMap and Secret; logs: its pods listed,
  then each index's newest pod read, all at once, streamed with `follow`;
- the run files' pass (run_files.py): ended attempts' Secrets and ConfigMaps deleted by their
  tokens' label, two requests per SELECTED_AT_ONCE attempts, all at once.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextvars
import dataclasses
import io
import json
import re
import ssl
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from corral import keepalive, pacing
from corral.config import KubeEntry
from corral.errors import ClusterError, ClusterUnreachableError, ConfigError, CorralError
from corral.infra.base import (
    AttemptFiles,
    ClusterSnapshot,
    EndedRun,
    Infra,
    JobRequest,
    JobStatus,
    OutputSink,
    RemovesRunFiles,
    SubmitResult,
)
from corral.infra.kube import capacity, manifests, rbac, states, watch
from corral.infra.ranks import WholeLines, first_failure, rank_label
from corral.infra.shell import render_env

LOG_POLL_SECONDS = 1.0
SELECTED_AT_ONCE = 100  # tokens in one label selector (a delete of a collection): the URL stays short
_DELETE_OPTIONS = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
# A server makes a Client (and so KubeInfras) per request: the watches are the process's, not theirs.
_WATCHERS: dict[tuple[str, str, str], watch.Watcher] = {}
_SHARED_LOCK = threading.Lock()


class KubeInfra(Infra, RemovesRunFiles):
    kind: ClassVar[str] = "k8s"

    def __init__(self, entry: KubeEntry, round_trips: Any = None, timeout: float = 10.0):
        self.entry = entry
        self.timeout = timeout
        self._round_trips = round_trips  # the transport's Counter, so that every kind is counted alike
        self._api: Any = None
        self._namespace: str | None = entry.namespace
        self._gpu_label: dict[str, tuple[str, str]] = {}  # GPU type as labelled -> (label, resource)
        self._uploads: dict[str, list[tuple[Path, str]]] = {}  # token -> (local, remote) for its ConfigMap
        self._watcher: watch.Watcher | None = None

    @property
    def name(self) -> str:
        return f"k8s/{self.entry.name}"

    # ---- the API ----------------------------------------------------------------------------------------
    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import config  # the server's import only: not on the CLI's path

            path = self.entry.kubeconfig
            try:
                contexts, _ = config.list_kube_config_contexts(config_file=path)
                found = next((c for c in contexts if c.get("name") == self.entry.name), None)
                if found is None:
                    known = ", ".join(sorted(c.get("name", "?") for c in contexts)) or "none"
                    raise ConfigError(f"kubernetes: no context {self.entry.name!r} in the kubeconfig "
                                      f"({path or '$KUBECONFIG or ~/.kube/config'}); its contexts: {known}")
                self._namespace = self._namespace or (found.get("context") or {}).get("namespace") or "default"
                self._api = config.new_client_from_config(config_file=path, context=self.entry.name,
                                                          client_configuration=_keepalive_configuration())
            except CorralError:
                raise
            except Exception as exc:  # the client's own errors: a missing or malformed kubeconfig
                raise ConfigError(f"kubernetes: cannot load the kubeconfig for context {self.entry.name!r}: "
                                  f"{' '.join(str(exc).split())}") from None
        return self._api

    @property
    def namespace(self) -> str:
        self._client()
        return self._namespace or "default"

    def _send(self, method: str, path: str, query: Sequence[tuple[str, Any]], body: Any, timeout: Any,
              content_type: str = "application/json") -> Any:
        """One request (blocking), its urllib3 response unread. Raises ClusterUnreachableError."""
        api = self._client()
        if self._round_trips is not None:
            self._round_trips[self.entry.name] += 1
        try:
            method, url, headers, body, post = api.param_serialize(
                method, path, query_params=list(query), body=body, auth_settings=["BearerToken"],
                header_params={"Accept": "application/json", "Content-Type": content_type})
            return api.call_api(method, url, header_params=headers, body=body, post_params=post,
                                _request_timeout=timeout).response
        except Exception as exc:  # urllib3's: refused, timed out, name not resolved
            raise ClusterUnreachableError(self.entry.name, f"the API server at {api.configuration.host} does not "
                                                           f"answer: {why_unanswered(exc)}") from None

    async def _call(self, method: str, path: str, *, query: Sequence[tuple[str, Any]] = (), body: Any = None,
                    allow: tuple[int, ...] = (), content_type: str = "application/json") -> tuple[int, Any]:
        """One API request in a worker thread: (status, parsed JSON). Statuses in `allow` are answers."""
        def send() -> tuple[int, Any]:
            response = self._send(method, path, query, body, (self.timeout, self.timeout * 3), content_type)
            data = response.data
            if response.status < 300 or response.status in allow:
                return response.status, _loads(data)
            raise ClusterError(self.entry.name, _api_message(response.status, data, response.reason))

        return await asyncio.to_thread(send)

    async def _list(self, path: str, **query: str) -> list[dict[str, Any]]:
        items, _ = await asyncio.to_thread(self._list_sync, path, [(k, v) for k, v in query.items() if v])
        return items

    # ---- capacity ---------------------------------------------------------------------------------------
    async def probe(self, *, associations: bool = False, paths: tuple[str, ...] = (),
                    filesystems: tuple[str, ...] = ()) -> ClusterSnapshot:
        """With `associations` (`corral check`), the user's RBAC rights in the namespace are reviewed
        alongside (rbac.py), and what is missing becomes the snapshot's warnings."""
        started = time.monotonic()
        lists = asyncio.gather(
            self._list("/api/v1/nodes"),
            self._list("/api/v1/pods", fieldSelector="status.phase!=Succeeded,status.phase!=Failed"))
        if associations:
            (nodes, pods), rights = await asyncio.gather(lists, self._rbac_warnings())
        else:
            (nodes, pods), rights = await lists, []
        try:
            snap = capacity.snapshot(self.entry.name, nodes, pods, probe_seconds=time.monotonic() - started)
        except (KeyError, ValueError, TypeError) as exc:
            raise ClusterError(self.entry.name, f"cannot read the API's node or pod list: {exc}") from None
        for node in nodes:
            gpu = capacity.node_gpus(node)
            if gpu is not None and gpu.value:
                self._gpu_label[gpu.value] = (gpu.label, gpu.resource)
        return dataclasses.replace(snap, warnings=snap.warnings + tuple(rights)) if rights else snap

    async def _rbac_warnings(self) -> list[str]:
        """One rules review; for each right it does not show, an access review (all at once)."""
        ns = self.namespace
        try:
            _, review = await self._call("POST", rbac.RULES_REVIEWS, body=rbac.rules_review(ns))
            asked = rbac.unshown(review or {})
            answers = await asyncio.gather(*(self._call("POST", rbac.ACCESS_REVIEWS, body=rbac.access_review(ns, *a))
                                             for a in asked))
        except CorralError as exc:
            return [f"could not review your RBAC rights in namespace {ns}: {exc}"]
        return rbac.warnings([a for a, (_, answer) in zip(asked, answers) if not rbac.allowed(answer or {})], ns)

    # ---- files ------------------------------------------------------------------------------------------
    def attempt_files(self, request: JobRequest) -> AttemptFiles:
        name = manifests.object_name(request.token)
        return AttemptFiles(f".corral/runs/{request.token}", (f"pod:{name}",))

    async def upload(self, local: Any, remote: str, token: str | None = None) -> None:
        """Kept for the ConfigMap of the attempt it goes with (`token`, or the run folder `remote` is in);
        read when that attempt is submitted. A path outside a run's folder with no token has no attempt
        to go with: a caller's mistake, refused rather than handed to whichever submission comes next."""
        token = token or _run_token(remote)
        if not token:
            raise ValueError(f"{self.name}: an upload to {remote!r} names no attempt to go with")
        self._uploads.setdefault(token, []).append((Path(local), remote))

    # ---- jobs -------------------------------------------------------------------------------------------
    async def submit(self, request: JobRequest) -> SubmitResult:
        ns = self.namespace
        name = manifests.object_name(request.token)
        try:  # in a thread: packing (gzip) a large workdir would hold up every other request meanwhile
            archives = await asyncio.to_thread(_archives, self._uploads.get(request.token, []),
                                               manifests.CONFIGMAP_LIMIT)
        except _TooLarge:
            archives = None
        if archives is None or sum(len(v) for v in archives.values()) > manifests.CONFIGMAP_LIMIT:
            self._uploads.pop(request.token, None)
            return SubmitResult(False, None, False,
                                f"{self.name}: the workdir and file mounts come to more than "
                                f"{manifests.CONFIGMAP_LIMIT // 1000} kB packed; a ConfigMap holds at most 1 MiB: "
                                "put the data on a volume the pods mount (config.kubernetes.pod_config)")
        files = {"setup.sh": request.setup or "", "run.sh": request.run or ""}
        label, resource = self._gpu_label.get(request.accelerator_type or "",
                                              (capacity.DEFAULT_GPU_LABEL, capacity.DEFAULT_GPU_RESOURCE))
        made = [f"/api/v1/namespaces/{ns}/configmaps/{name}", f"/api/v1/namespaces/{ns}/secrets/{name}"]
        posted = await asyncio.gather(
            self._call("POST", f"/api/v1/namespaces/{ns}/configmaps",
                       body=manifests.config_map(request, files, archives), allow=(403, 409, 422)),
            self._call("POST", f"/api/v1/namespaces/{ns}/secrets",
                       body=manifests.env_secret(request, render_env(dict(request.envs))), allow=(403, 409, 422)))
        refused = [(kind, status, answer) for kind, (status, answer) in zip(("configmaps", "secrets"), posted)
                   if status in (403, 422)]
        if refused:
            await self._delete(made)
            kind, status, answer = refused[0]
            hint = (f"; Corral needs create, patch, delete and deletecollection on {kind} in namespace {ns} "
                    "(docs/kubernetes.md)" if status == 403 else "")
            return SubmitResult(False, None, False, f"{self.name}: {_api_message(status, answer)}{hint}")
        status, answer = await self._call("POST", f"/apis/batch/v1/namespaces/{ns}/jobs",
                                          body=manifests.job(request, self.entry.name, label, resource),
                                          allow=(400, 403, 409, 422))
        if status in (400, 403, 422):
            await self._delete(made)
            return SubmitResult(False, None, False, f"{self.name}: {_api_message(status, answer)}")
        if status == 409:  # a retried submission: its Job (and what the first try made) is there
            _, answer = await self._call("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}", allow=(404,))
        owner = manifests.owned_by(answer or {})
        # The Service, the ConfigMap and the Secret belong to the Job: Kubernetes removes them with it.
        calls = [self._call("POST", f"/api/v1/namespaces/{ns}/services", body=manifests.service(request, owner),
                            allow=(409,))]
        if owner:
            calls += [self._call("PATCH", path, body={"metadata": owner}, content_type="application/merge-patch+json",
                                 allow=(404,)) for path in made]
        await asyncio.gather(*calls)
        self._uploads.pop(request.token, None)
        return SubmitResult(True, name, status == 409, "")

    def _watch(self) -> watch.Watcher:
        """The namespace's Corral Jobs and pods, kept current by watches: one set per kubeconfig,
        context and namespace in this process (started on first use, shared by every KubeInfra of it)."""
        if self._watcher is None:
            ns = self.namespace
            key = (self.entry.kubeconfig or "", self.entry.name, ns)
            with _SHARED_LOCK:
                found = _WATCHERS.get(key)
                if found is None:
                    found = _WATCHERS[key] = watch.Watcher(
                        {"jobs": f"/apis/batch/v1/namespaces/{ns}/jobs", "pods": f"/api/v1/namespaces/{ns}/pods"},
                        f"{manifests.LABEL_MANAGED}=corral", self._list_sync, self._stream_sync)
            self._watcher = found
        return self._watcher

    def _list_sync(self, path: str, query: list[tuple[str, str]]) -> tuple[list[dict[str, Any]], str | None]:
        response = self._send("GET", path, query, None, (self.timeout, self.timeout * 3))
        if response.status >= 300:
            raise ClusterError(self.entry.name, _api_message(response.status, response.data, response.reason))
        answer = _loads(response.data) or {}
        return list(answer.get("items") or []), (answer.get("metadata") or {}).get("resourceVersion")

    def _stream_sync(self, path: str, query: list[tuple[str, str]]) -> Any:
        response = self._send("GET", path, query, None, (self.timeout, watch.WATCH_SECONDS + 30))
        try:
            if response.status >= 300:
                raise ClusterError(self.entry.name, _api_message(response.status, response.data, response.reason))
            yield from response.stream(65536)
        finally:
            response.release_conn()

    async def status(self, handles: list[str], accounts: Sequence[str] = (), *, others: bool = True
                     ) -> list[JobStatus]:
        """From the watches' cache once it is synced and holds every handle asked about (no request);
        otherwise from two lists, asked together."""
        ns = self.namespace
        selector = f"{manifests.LABEL_MANAGED}=corral"
        watcher = self._watch()
        cached = watcher.snapshot() if watcher.synced else None
        names = {j["metadata"]["name"] for j in cached["jobs"]} if cached else set()
        if cached and all(h in names for h in handles if manifests.token_of(h)):
            jobs, pods = cached["jobs"], cached["pods"]
        else:
            jobs, pods = await asyncio.gather(
                self._list(f"/apis/batch/v1/namespaces/{ns}/jobs", labelSelector=selector),
                self._list(f"/api/v1/namespaces/{ns}/pods", labelSelector=selector))
        events: list[dict[str, Any]] = []
        if any((p.get("status") or {}).get("phase") == "Pending" for p in pods):
            events = await self._list(f"/api/v1/namespaces/{ns}/events", fieldSelector="type=Warning")
        return states.statuses(jobs, pods, events)

    async def cancel(self, handles: list[str], run_dirs: list[str]) -> None:
        ns = self.namespace
        paths = []
        for handle in handles:
            if manifests.token_of(handle) is None:
                continue
            paths += [f"/apis/batch/v1/namespaces/{ns}/jobs/{handle}", f"/api/v1/namespaces/{ns}/services/{handle}",
                      f"/api/v1/namespaces/{ns}/configmaps/{handle}", f"/api/v1/namespaces/{ns}/secrets/{handle}"]
        await self._delete(paths)

    async def remove_env_files(self, ended: list[EndedRun]) -> None:
        """Delete each one's Secret (its env.sh) and ConfigMap (its scripts and packed workdir), which
        an ended Job no longer needs (Corral never lets Kubernetes run it again): SELECTED_AT_ONCE
        tokens per request, one request per kind, all together. The Job, and so its pods' log, stays
        until its TTL. What a crash left before the Job was made goes too: it carries the token's label."""
        tokens = sorted({_run_token(e.run_dir) or "" for e in ended})
        for token in tokens:
            manifests.object_name(token)  # a token, or ValueError: nothing else goes into the selector
        ns = self.namespace
        calls = []
        for start in range(0, len(tokens), SELECTED_AT_ONCE):
            selector = f"{manifests.LABEL_TOKEN} in ({','.join(tokens[start:start + SELECTED_AT_ONCE])})"
            calls += [self._call("DELETE", f"/api/v1/namespaces/{ns}/{kind}", query=[("labelSelector", selector)],
                                 body=_DELETE_OPTIONS) for kind in ("secrets", "configmaps")]
        await asyncio.gather(*calls)

    async def remove_run_dirs(self, ended: list[EndedRun]) -> None:
        """As remove_env_files: a pod's home, where its run directory was, ended with the pod."""
        await self.remove_env_files(ended)

    async def _delete(self, paths: list[str]) -> None:
        await asyncio.gather(*(self._call("DELETE", p, body=_DELETE_OPTIONS, allow=(404,)) for p in paths))

    async def logs(self, handle: str, log_path: str, follow: bool, on_output: OutputSink, tail: int = 0) -> None:
        """Every pod's output, as a Slurm job's log holds every node's: on several pods, each line after its
        rank (ranks.py); followed, as it comes in whole lines, else pod by pod, the head pod's (node 0's)
        first. With `follow`, once the head pod starts, until the pods end."""
        ns = self.namespace
        selector = f"{states.JOB_NAME_LABEL}={handle}"
        while True:
            pods = await self._list(f"/api/v1/namespaces/{ns}/pods", labelSelector=selector)
            ranked = _pod_per_rank(pods)
            phase = _phase(ranked.get(0))
            if phase != "Pending" or not follow:
                break
            jobs = await self._list(f"/apis/batch/v1/namespaces/{ns}/jobs", fieldSelector=f"metadata.name={handle}")
            if not jobs or states.statuses(jobs, pods)[0].state.value not in ("PENDING", "RUNNING"):
                return
            await asyncio.sleep(LOG_POLL_SECONDS)
        if len(ranked) <= 1:
            for pod in ranked.values():
                await self._pod_log(ns, pod, follow, on_output, tail)
            return
        count = max(ranked) + 1
        sinks = {rank: WholeLines(on_output, rank_label(rank, count)) for rank in ranked}
        try:
            if follow:  # a pod whose read fails leaves the others' shown to their end; its error comes then
                results = await asyncio.gather(*(self._pod_log(ns, pod, follow, sinks[rank], tail)
                                                 for rank, pod in ranked.items()), return_exceptions=True)
                if (failed := first_failure(results)) is not None:
                    raise failed
                return
            for rank, pod in sorted(ranked.items()):
                await self._pod_log(ns, pod, follow, sinks[rank], tail)
                sinks[rank].flush()
        finally:
            for sink in sinks.values():
                sink.flush()

    async def _pod_log(self, ns: str, pod: dict[str, Any], follow: bool, on_output: OutputSink, tail: int) -> None:
        """One pod's log (followed while it runs), read on a thread of its own (_in_own_thread). Followed,
        a pod still pending (a worker pulling its image once the head runs) is waited for, until it starts
        or is gone, so that its output is not missed."""
        while follow and _phase(pod) == "Pending":
            await asyncio.sleep(LOG_POLL_SECONDS)
            name = pod["metadata"]["name"]
            found = await self._list(f"/api/v1/namespaces/{ns}/pods", fieldSelector=f"metadata.name={name}")
            if not found:
                return
            pod = found[0]
        reading = _LogRead()
        try:
            await _in_own_thread(self._stream_log, ns, pod["metadata"]["name"], follow and _phase(pod) == "Running",
                                 _from_thread(on_output, reading.stop), reading, tail)
        except _ReaderStopped:
            pass
        finally:
            reading.end()  # whoever asked stopped waiting: the reading thread ends now, quiet pod or not

    def _stream_log(self, ns: str, pod: str, follow: bool, on_output: OutputSink, reading: _LogRead,
                    tail: int = 0) -> None:
        query = [("follow", "true" if follow else "false"), *([("tailLines", str(int(tail)))] if tail > 0 else [])]
        response = self._send("GET", f"/api/v1/namespaces/{ns}/pods/{pod}/log", query, None,
                              (self.timeout, None) if follow else (self.timeout, self.timeout * 3))
        try:
            if response.status in (400, 404):  # not started yet, or gone
                return
            if response.status >= 300:
                raise ClusterError(self.entry.name, _api_message(response.status, response.data, response.reason))
            reading.opened(response)
            for chunk in response.stream(65536):
                on_output(chunk)
        except CorralError:
            if not reading.stop.is_set():
                raise
        except Exception as exc:  # urllib3's: the API server went away mid-stream (or we shut the socket)
            if not reading.stop.is_set():
                raise ClusterUnreachableError(self.entry.name, "the API server stopped sending the log "
                                                               f"({' '.join(str(exc).split())[:300]})") from None
        finally:
            reading.closed()
            response.release_conn()


def _keepalive_configuration() -> Any:
    """A client configuration whose connections have TCP keepalives (on top of urllib3's own socket
    options, which a list given replaces): a followed log or a watch, read without a time limit, then
    finds an API server that vanished."""
    import urllib3
    from kubernetes.client import Configuration

    configuration = Configuration()
    configuration.socket_options = [*urllib3.connection.HTTPConnection.default_socket_options,
                                    *keepalive.socket_options()]
    return configuration


class _LogRead:
    """One log read's thread, seen from the loop: `end()` sets `stop` and shuts the read side of the
    response's socket, so a thread blocked in a followed read of a quiet pod returns at once instead
    of when the pod next writes or ends (a thread and an API connection held per client gone)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None

    def opened(self, response: Any) -> None:
        with self._lock:
            self._response = response
        if self.stop.is_set():  # ended before the answer came
            self._shut()

    def closed(self) -> None:
        with self._lock:
            self._response = None

    def end(self) -> None:
        self.stop.set()
        self._shut()

    def _shut(self) -> None:
        with self._lock:
            if self._response is None:
                return
            try:
                self._response.shutdown()
            except (ValueError, RuntimeError, OSError):  # no socket to shut (already released or closed)
                pass


def _pod_per_rank(pods: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each completion index's pod: its newest, where a failed pod was replaced."""
    chosen: dict[int, dict[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        try:
            rank = int((meta.get("labels") or {}).get(states.INDEX_LABEL, ""))
        except ValueError:
            continue
        held = chosen.get(rank)
        if held is None or _created(pod) > _created(held):
            chosen[rank] = pod
    return chosen


def _created(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")  # RFC 3339 in UTC: sorts as text


def _phase(pod: dict[str, Any] | None) -> str:
    return ((pod or {}).get("status") or {}).get("phase") or "Pending"


async def _in_own_thread(read: Callable[..., None], *args: Any) -> None:
    """`read(*args)` on a thread of its own, not the loop's default executor: a followed log is read for
    as long as its pod runs, and that executor has min(32, CPUs + 4) threads (6 on two cores), so that six
    followed logs held every other API call of the server waiting for a thread."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    context = contextvars.copy_context()

    def settle(error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            context.run(read, *args)
        except BaseException as exc:  # handed to the awaiting task, as to_thread does
            error = exc
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:  # the loop has closed: no one awaits
            pass

    threading.Thread(target=run, name="corral-kube-log", daemon=True).start()
    await done


class _ReaderStopped(Exception):
    """Whoever read the log went away: the reading thread stops."""


def _from_thread(sink: OutputSink, stop: threading.Event) -> Callable[[bytes], None]:
    """`sink`, for a thread that reads a log: each chunk goes to the loop, then the thread keeps the
    stream's pace (pacing.keep_pace); once `stop` is set (whoever asked stopped waiting), the thread
    stops at its next chunk instead of reading on into a stream nobody reads."""
    loop = asyncio.get_running_loop()
    pace = pacing.OUTPUT_PACE.get()

    def hand_on(chunk: bytes) -> None:
        if stop.is_set():
            raise _ReaderStopped()
        loop.call_soon_threadsafe(sink, chunk)
        if pace is None:
            return
        room = asyncio.run_coroutine_threadsafe(pace(), loop)
        while True:
            try:
                room.result(timeout=0.5)
                return
            except concurrent.futures.TimeoutError:
                if stop.is_set():
                    room.cancel()
                    raise _ReaderStopped() from None

    return hand_on


def _loads(data: Any) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except (ValueError, TypeError):
        return None


def why_unanswered(exc: BaseException) -> str:
    """A failed request's cause in a few words (`connection refused`, `timed out`, `certificate verify
    failed: …`), from the innermost error urllib3 wraps; its whole message, on one line, if none says."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return "TLS: " + re.sub(r"^\[[^]]*\] | \(_ssl\.c:\d+\)$", "", str(seen.strerror or seen))
        if isinstance(seen, TimeoutError) or type(seen).__name__.endswith("TimeoutError"):
            return "timed out"
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror[:1].lower() + seen.strerror[1:]
        reason = getattr(seen, "reason", None)  # MaxRetryError's last attempt
        seen = reason if isinstance(reason, BaseException) else (seen.__cause__ or seen.__context__)
    return " ".join(str(exc).split())[:300]


def _api_message(status: int, body: Any, reason: str | None = None) -> str:
    """The API's own words (a Status object's message), with its code."""
    answer = _loads(body) if isinstance(body, (str, bytes)) else body
    message = (answer or {}).get("message") if isinstance(answer, dict) else None
    return f"the API answered {status}: {' '.join(str(message or reason or 'no message').split())}"


def _run_token(remote: str) -> str | None:
    prefix = ".corral/runs/"
    if remote.startswith(prefix):
        return remote[len(prefix):].split("/", 1)[0]
    return None


class _TooLarge(Exception):
    """The uploads packed past what a ConfigMap holds: packing stopped there."""


class _Capped(io.BytesIO):
    """An in-memory archive that refuses to grow past `limit` bytes (_TooLarge), so that a workdir of many
    GB costs a moment and about `limit` of memory to refuse, not its whole packed size."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.limit:
            raise _TooLarge()
        return super().write(data)


def _archives(uploads: list[tuple[Path, str]], limit: int) -> dict[str, str]:
    """The uploads as `home.tar.gz` (paths under the home) and `root.tar.gz` (absolute), base64; _TooLarge
    once either comes to more than `limit` bytes in base64."""
    trees: dict[str, io.BytesIO] = {}
    tars: dict[str, tarfile.TarFile] = {}
    for local, remote in uploads:
        key = "root.tar.gz" if remote.startswith("/") else "home.tar.gz"
        if key not in tars:
            trees[key] = _Capped(limit * 3 // 4)  # base64 makes 4 bytes of 3
            tars[key] = tarfile.open(fileobj=trees[key], mode="w:gz")
        target = remote.lstrip("/").removeprefix("~/").rstrip("/")
        if local.is_dir():
            for path in sorted(local.rglob("*")):
                tars[key].add(path, arcname=f"{target}/{path.relative_to(local)}", recursive=False)
        else:
            tars[key].add(local, arcname=f"{target}/{local.name}" if remote.endswith("/") else target)
    for tar in tars.values():
        tar.close()
    return {key: base64.b64encode(tree.getvalue()).decode() for key, tree in trees.items()}
