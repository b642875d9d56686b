"""The server's HTTP application: authentication, health and wake-up, and the `/v1` API (`v1.py`).

Every request carries a bearer token: the server's own, which it writes, readable only by its Unix
account, into `controller.json` under CORRAL_HOME next to the port; or a team member's from `corral users
add` (see auth.py, which also covers single sign-on through a trusted proxy). The user a request acts for
is `request.state.principal`; a team server logs one line per request naming them (never a token).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, Security
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from corral import budget
from corral.controller.engine import LEASE
from corral.errors import (
    EXIT_DATAERR,
    EXIT_NOINPUT,
    EXIT_NOPERM,
    EXIT_USAGE,
    CorralError,
)
from corral.state import Store

# How a request says who it is, as the OpenAPI document tells clients (`authorized` reads the header itself).
BEARER = HTTPBearer(auto_error=False, description="The server's token (`controller.json` under CORRAL_HOME) or "
                    "a team member's from `corral users add`; the dashboard's session cookie also serves")

# The framework's own refusals: the `kind` and exit code their JSON body names (Corral's are its errors').
_HTTP_REFUSALS = {401: ("Unauthenticated", EXIT_NOPERM), 404: ("NotFound", EXIT_NOINPUT),
                  405: ("MethodNotAllowed", EXIT_USAGE)}


@dataclass
class TickFigures:
    at: float
    seconds: float
    drove: bool
    jobs: int
    submitted: int
    moved: int
    cancelled: int
    round_trips: dict[str, int]
    errors: dict[str, str]
    disagreement: str | None = None  # replicas read different cluster lists: nothing was driven
    submitting: int = 0  # jobs whose submission still ran beside the ticks (engine.py)


@dataclass
class ControllerStatus:
    """What the loop shares with the API. Both run on one event loop (the endpoints are `async def`,
    so Starlette does not move them to threads): no locking needed, and `wake` is an asyncio.Event."""

    pid: int
    holder: str
    started_at: float
    interval: float
    ticks: int = 0
    last_tick: TickFigures | None = None
    wake: Any = field(default=None, repr=False)  # an asyncio.Event, set by POST /wake


API_VERSION = "v1"


def shards_of(store: Store) -> dict[str, object]:
    """Who drives what: each cluster's holder, and the live replicas with their heartbeat's expiry and the
    cluster list each reads (shards.cluster_list_note)."""
    from corral.controller.shards import live_leases

    live = live_leases(store, time.time())
    return {"clusters": live.clusters, "replicas": live.replicas, "cluster_lists": live.cluster_lists}


def create_app(status: ControllerStatus, store: Store, token: str, refreshes: Any = None, *,
               sso_header: str | None = None, trusted_proxies: tuple[str, ...] = (),
               access_log: bool = False) -> FastAPI:
    from corral import __version__
    from corral.controller.auth import Authenticator, Unauthenticated
    from corral.controller.bodylimit import BodyLimit
    from corral.controller.refusals import known_query_only, refusals, refused_status
    from corral.controller.v1 import create_router
    from corral.controller.web import COOKIE, add_pages

    app = FastAPI(title="Corral", version=__version__, docs_url=None, redoc_url=None, redirect_slashes=False,
                  openapi_url=f"/{API_VERSION}/openapi.json",
                  description="One engine behind every face: the API the `corral` CLI and `corral.sdk` use. "
                              "Every request carries `Authorization: Bearer <token>`.")

    app.add_middleware(BodyLimit)  # before FastAPI reads a body, which it does before the token check
    authenticator = Authenticator(store, token, sso_header, trusted_proxies)

    async def authorized(request: Request, _: Annotated[Any, Security(BEARER)]) -> None:  # BEARER: for the OpenAPI
        try:
            request.state.principal = authenticator.principal(
                request.headers.get("authorization", ""), request.headers,
                request.client.host if request.client else None,
                session=request.cookies.get(COOKIE, ""), method=request.method)
        except Unauthenticated as exc:
            raise HTTPException(status_code=401, detail=str(exc)) from None

    if access_log:
        @app.middleware("http")
        async def log_request(request: Request, call_next: Any) -> Any:
            """One line per request: who (never their token), what, the answer, how long."""
            started = time.monotonic()
            response = await call_next(request)
            principal = getattr(request.state, "principal", None)
            who = principal.display if principal else "-"
            client = request.client.host if request.client else "-"
            print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {client} {who} {request.method} {request.url.path} "
                  f"{response.status_code} {1000 * (time.monotonic() - started):.0f}ms", flush=True)
            return response

    async def health() -> dict[str, object]:
        """The server's pid, uptime, controller ticks, the store's lease, and each cluster's Slurm
        command budget as used in the last minute (budget.py)."""
        lease = store.lease(LEASE)
        return {"pid": status.pid, "holder": status.holder, "started_at": status.started_at,
                "uptime_seconds": round(time.time() - status.started_at, 3), "interval": status.interval,
                "ticks": status.ticks, "last_tick": asdict(status.last_tick) if status.last_tick else None,
                "lease": {"holder": lease.holder, "expires_at": lease.expires_at} if lease else None,
                "shards": shards_of(store),
                "rpc_budget": budget.report(), "api": API_VERSION, "version": __version__}

    async def wake() -> dict[str, object]:
        """Tick the controller now (new managed work)."""
        status.wake.set()
        return {"woken": True, "ticks": status.ticks}

    guarded = [Depends(authorized), Depends(known_query_only)]  # every API route
    for prefix in ("", f"/{API_VERSION}"):  # unversioned: what controllers before /v1 answered
        app.add_api_route(f"{prefix}/health", health, methods=["GET"], dependencies=guarded,
                          responses=refusals(401), include_in_schema=bool(prefix))
        app.add_api_route(f"{prefix}/wake", wake, methods=["POST"], dependencies=guarded,
                          responses=refusals(401), include_in_schema=bool(prefix))
    v1_router = create_router(store, refreshes, wake=lambda: status.wake.set() if status.wake else None)
    app.include_router(v1_router, dependencies=guarded)

    add_pages(app, store)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """What the framework and the token check refuse (a body that is not JSON, no token, no such route),
        in the shape of Corral's own refusals."""
        kind, exit_code = _HTTP_REFUSALS.get(exc.status_code, ("BadRequest", EXIT_DATAERR))
        headers = exc.headers
        if exc.status_code == 405:  # Starlette names only the first matching route's methods
            routes = [*app.router.routes, *v1_router.routes]  # FastAPI keeps an included router whole
            headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(routes, request.url.path))}
        return JSONResponse(status_code=exc.status_code, headers=headers,
                            content={"detail": {"message": str(exc.detail), "kind": kind, "exit_code": exit_code}})

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
        """The client went while its body was coming (or was closed for sending it too slowly:
        protocol.py). Nobody is left to answer, and it is no fault of the server's: a line, not a traceback."""
        print(f"{request.method} {request.url.path}: the client went before its body had all come", flush=True)
        return Response(status_code=400)

    @app.exception_handler(CorralError)
    async def corral_error(request: Request, exc: CorralError) -> JSONResponse:
        """What Corral refuses on purpose (a broken cluster file, an unknown name): its one-line message."""
        return JSONResponse(status_code=refused_status(exc),
                            content={"detail": {"message": str(exc), "kind": type(exc).__name__,
                                                "exit_code": exc.exit_code}})

    return app


def allowed_methods(routes: list[Any], path: str) -> list[str]:
    """Every method `path` answers to, whichever route serves each (RFC 9110's `Allow`). As OpenAPI
    matches paths, a concrete one (`/v1/managed/cancel`) is its own resource, apart from a template
    that also matches it (`/v1/managed/{job}`)."""
    from starlette.routing import Match

    scope = {"type": "http", "path": path, "root_path": "", "method": ""}
    matched = [route for route in routes
               if getattr(route, "methods", None) and route.matches(scope)[0] is not Match.NONE]
    concrete = [route for route in matched if "{" not in route.path]
    return sorted({method for route in concrete or matched for method in route.methods})
