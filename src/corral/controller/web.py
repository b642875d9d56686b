"""The dashboard: static pages served at `/` that call the same `/v1` API as the CLI, and its login.

`corral dashboard` asks `POST /v1/dashboard/link` (with the CLI's token) for a one-time link, as
Jupyter's tokenized URL works: `GET /login?code=…` swaps the code (single use, a minute) for a browser
session, an HttpOnly, SameSite=Strict cookie that stands for the same user for 12 hours. Only SHA-256
hashes of codes and sessions reach the store, so every replica knows them and no dump leaks one.
Requests authenticated by the cookie that change something must also carry `X-Corral-Dashboard`,
which a cross-site form cannot send. A single sign-on proxy's header works here as on the API.

The pages are plain HTML, CSS and JavaScript shipped in the package (`dashboard/`): no build step, no
third-party code, a few tens of KB. Cost: one indexed query per request carrying the cookie.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from pathlib import Path

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from corral.controller.auth import Me
from corral.state import Store

COOKIE = "corral_session"
CSRF_HEADER = "X-Corral-Dashboard"
CODE_SECONDS = 60
SESSION_SECONDS = 12 * 3600
ASSETS = Path(__file__).parent / "dashboard"
_FILES = {"app.js": "text/javascript", "app.css": "text/css"}
_SECURITY_HEADERS = {
    # Nothing but the dashboard's own files and its own API; no framing (clickjacking).
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_login_code(store: Store, owner: str) -> str:
    code = secrets.token_urlsafe(32)
    store.add_web_session(digest(code), "code", owner, time.time() + CODE_SECONDS)
    return code


def session_owner(store: Store, session: str) -> str | None:
    """Whose browser session this cookie is, or None (unknown or expired)."""
    return store.web_session(digest(session)) if session else None


def add_api_routes(router: APIRouter, store: Store) -> None:
    @router.post("/dashboard/link")
    async def dashboard_link(me: Me) -> dict[str, object]:
        """A one-time login link for the dashboard (a path; valid once, for a minute), for this user."""
        code = new_login_code(store, me.owner)
        return {"path": f"/login?code={code}", "expires_in": CODE_SECONDS}


def add_pages(app: FastAPI, store: Store) -> None:
    """The dashboard's pages and its login; none of these needs the API's token."""

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return FileResponse(ASSETS / "index.html", media_type="text/html", headers=_SECURITY_HEADERS)

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in _FILES:
            return Response(status_code=404)
        return FileResponse(ASSETS / name, media_type=_FILES[name], headers=_SECURITY_HEADERS)

    @app.get("/login", include_in_schema=False)
    async def login(request: Request, code: str = Query("", max_length=200)) -> Response:
        owner = store.take_web_code(digest(code)) if code else None
        if owner is None:
            return Response("This login link is used or expired: run `corral dashboard` again.\n", status_code=401,
                            media_type="text/plain", headers=_SECURITY_HEADERS)
        session = secrets.token_urlsafe(32)
        store.add_web_session(digest(session), "session", owner, time.time() + SESSION_SECONDS)
        response = RedirectResponse("/", status_code=303, headers=_SECURITY_HEADERS)
        response.set_cookie(COOKIE, session, max_age=SESSION_SECONDS, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https", path="/")
        return response
