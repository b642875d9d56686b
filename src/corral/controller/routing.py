"""The API's route class: a path parameter may hold a slash.

A job's name may hold one (`corral launch -n exp/lr=0.1`), and the SDK sends it percent-encoded as one
path segment (`/v1/jobs/exp%2Flr%3D0.1/logs`). The server decodes the whole path before routing, so
that segment became two and no route matched: `corral logs exp/lr=0.1` said "Not Found". Here, when
the path as sent (ASGI's `raw_path`) holds an encoded slash, a route is matched on the path decoded
segment by segment, each slash inside a segment held by a placeholder, and the parameters get their
slashes back. Any other path is matched as before. Cost: a byte search per route tried, and for a
path with an encoded slash, its decoding.
"""

from __future__ import annotations

import urllib.parse

from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Scope

SLASH = "\ue000"  # a private-use character: stands for a slash inside one segment while routing


def segmented_path(raw_path: bytes) -> str | None:
    """The path decoded segment by segment, a slash inside a segment as SLASH; None where that cannot
    be told apart (the path is not ASCII, or already holds SLASH)."""
    try:
        sent = raw_path.decode("ascii")
    except UnicodeDecodeError:
        return None
    segments = [urllib.parse.unquote(segment) for segment in sent.split("/")]
    if any(SLASH in segment for segment in segments):
        return None
    return "/".join(segment.replace("/", SLASH) for segment in segments)


class RawPathRoute(APIRoute):
    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        raw = scope.get("raw_path") or b""
        path = segmented_path(raw) if b"%2f" in raw.lower() and not scope.get("root_path") else None
        if path is None:
            return super().matches(scope)
        match, child = super().matches({**scope, "path": path})
        if "path_params" in child:
            child["path_params"] = {key: value.replace(SLASH, "/") if isinstance(value, str) else value
                                    for key, value in child["path_params"].items()}
        return match, child
