"""Corral's Python SDK: the same HTTP API the `corral` command uses, with typed results.

    from corral.sdk import Client

    client = Client()                      # this user's local server, started on demand
    for check in client.check():
        print(check.cluster, "OK" if check.ok else check.error)
    for row in client.gpus("H100").rows:
        print(row.cluster, row.partition, row.free, "/", row.total)
    for job in client.queue().jobs:
        print(job.job_id, job.state)
    for chunk in client.logs("c-1234abcd", follow=True):
        print(chunk, end="")

`Client(url, token)` (or `CORRAL_API_URL` and `CORRAL_API_TOKEN`, or `corral api login`) talks to a remote
server instead. Standard library only: importing it loads neither the engine nor its dependencies.
Every failure is a `CorralError` (an `ApiError` for what the server refused) with the server's message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from corral.errors import CorralError
from corral.sdk import endpoint as _endpoint
from corral.sdk.types import (
    CancelOutcome,
    ClusterCheck,
    GpuReport,
    GpuRow,
    Job,
    QueuePage,
    Unreachable,
)

API = "/v1"


class ApiError(CorralError):
    """The server answered with an error: its message, and the HTTP status."""

    def __init__(self, message: str, status: int, kind: str = ""):
        super().__init__(message)
        self.status = status
        self.kind = kind


class ServerUnreachableError(CorralError):
    """No answer from the server (not running, wrong URL, network)."""


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 120.0):
        self._remote = _endpoint.remote(url, token)
        self._endpoint: _endpoint.Endpoint | None = self._remote
        self.timeout = timeout

    @property
    def endpoint(self) -> _endpoint.Endpoint:
        if self._endpoint is None:
            self._endpoint = _endpoint.local()
        return self._endpoint

    # ---- operations -----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._json("GET", "/health")

    def check(self, clusters: list[str] | None = None, *, timeout: float | None = None) -> list[ClusterCheck]:
        """Each cluster's login node and Slurm controller, probed now (in parallel)."""
        data = self._json("GET", "/check", {"cluster": clusters or [], "timeout": timeout})
        return [ClusterCheck.from_json(c) for c in data["clusters"]]

    def gpus(self, gpu: str | None = None, infra: str | None = None, *, timeout: float | None = None) -> GpuReport:
        """GPUs per cluster and partition, probed now (never cached capacity)."""
        data = self._json("GET", "/gpus", {"gpu": gpu, "infra": infra, "timeout": timeout})
        return GpuReport([GpuRow.from_json(r) for r in data["rows"]],
                         [Unreachable.from_json(f) for f in data["failures"]])

    def queue(self, *, limit: int = 20, page: int = 1, since: float | None = None, allocation: str | None = None,
              by_sweep: bool = False) -> QueuePage:
        """Live jobs and the newest ended ones (`limit` per page), newest first, refreshed from the clusters."""
        data = self._json("GET", "/queue", {"limit": limit, "page": page, "since": since,
                                            "allocation": allocation, "by_sweep": by_sweep})
        return QueuePage([Job.from_json(j) for j in data["jobs"]], int(data["more"]), data.get("sweeps") or {},
                         list(data.get("warnings") or []))

    def queue_all(self, *, since: float | None = None, allocation: str | None = None) -> Iterator[Job]:
        """Every job, newest first, streamed (memory stays flat on both sides)."""
        for line in self._stream("GET", "/queue/all", {"since": since, "allocation": allocation}, lines=True):
            yield Job.from_json(json.loads(line))

    def job(self, job: str) -> Job:
        return Job.from_json(self._json("GET", f"/jobs/{urllib.parse.quote(job, safe='')}"))

    def logs(self, job: str, follow: bool = False) -> Iterator[bytes]:
        """A job's output as it comes (all nodes); with `follow`, until the job's tasks are over."""
        yield from self._stream("GET", f"/jobs/{urllib.parse.quote(job, safe='')}/logs", {"follow": follow})

    def cancel(self, jobs: list[str] | None = None, *, all: bool = False) -> list[CancelOutcome]:
        """Cancel jobs (one scancel per cluster); ended ones are reported as they are."""
        data = self._json("POST", "/cancel", body={"jobs": list(jobs or []), "all": all})
        return [CancelOutcome(c["job_id"], bool(c["cancelled"]), c["state"]) for c in data["jobs"]]

    def wait(self, job: str, *, poll: float = 2.0, timeout: float | None = None) -> Job:
        """Until the job has ended; returns it (its state says how)."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = self.job(job)
            if found.ended:
                return found
            if deadline is not None and time.monotonic() > deadline:
                raise CorralError(f"{job} still {found.state} after {timeout:g}s")
            time.sleep(poll)

    def managed_jobs(self, *, limit: int = 20, page: int = 1, all: bool = False) -> dict[str, Any]:
        return self._json("GET", "/managed", {"limit": limit, "page": page, "all": all})

    def managed_job(self, job: str) -> dict[str, Any]:
        return self._json("GET", f"/managed/{urllib.parse.quote(job, safe='')}")

    # ---- transport ------------------------------------------------------------------------------
    def _request(self, method: str, path: str, query: dict[str, Any] | None, body: Any) -> Any:
        params = []
        for key, value in (query or {}).items():
            if value is None or value is False:
                continue
            for one in value if isinstance(value, list) else [value]:
                params.append((key, "true" if one is True else str(one)))
        point = self.endpoint
        url = f"{point.url}{API}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {point.token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            where = "the local Corral server" if point.local else point.url
            raise ServerUnreachableError(f"{where} did not answer: {getattr(exc, 'reason', exc)}"
                                         + ("" if point.local else "; check the URL, or `corral api logout`")) \
                from None

    def _json(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None) -> Any:
        with self._request(method, path, query, body) as response:
            raw = response.read()
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(f"the server's answer to {path} is not JSON", 502) from None

    def _stream(self, method: str, path: str, query: dict[str, Any], lines: bool = False) -> Iterator[Any]:
        with self._request(method, path, query, None) as response:
            if lines:
                for line in response:
                    if line.strip():
                        yield line
                return
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    return
                yield chunk


def _api_error(exc: urllib.error.HTTPError) -> ApiError:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    kind = ""
    if isinstance(detail, dict):  # a CorralError the server raised: its message and class
        detail, kind = detail.get("message"), str(detail.get("kind", ""))
    if isinstance(detail, list):  # FastAPI's validation errors: name the fields
        parts = [f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
                 if isinstance(d, dict)]
        detail = "; ".join(parts) or None
    if exc.code >= 500:
        detail = (f"the server failed ({detail or exc.reason}): a bug in Corral; its log says why "
                  "(a local server's is controller.log in CORRAL_HOME)")
    if exc.code == 401:
        detail = f"{detail or 'unauthorized'} (the server refused the token; `corral api login URL --token ...`)"
    return ApiError(str(detail or f"HTTP {exc.code} {exc.reason}"), exc.code, kind)


__all__ = ["ApiError", "CancelOutcome", "Client", "ClusterCheck", "GpuReport", "GpuRow", "Job", "QueuePage",
           "ServerUnreachableError", "Unreachable"]
