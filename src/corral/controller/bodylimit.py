"""A cap on request bodies, checked before anything reads them.

FastAPI reads and parses an operation's whole JSON body before its dependencies run, the token check
among them: without a cap, anyone who can reach a team server could make it hold (and parse) a body of
any size. Here a body over MAX_REQUEST_BODY is refused with 413 and the API's JSON refusal, whoever sent
it: at once when its Content-Length says so, else as soon as the chunks received pass the cap. The rest
of such a body is read and dropped (up to DRAIN_BYTES) before the answer, so the client, still sending,
is not reset and reads it; a client that asked `Expect: 100-continue` is answered before it sends.
Uploads (`PUT /v1/uploads/{digest}`) stream to disk behind the token check and have their own cap
(uploads.py). Cost: a header lookup per request; a chunked body (rare: the SDK sends Content-Length)
is held here before the app reads it, as the app would hold it anyway."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from corral.errors import EXIT_USAGE

MAX_REQUEST_BODY = 16 * 1024 * 1024  # 16 tasks of the largest task file (1 MiB), JSON-escaped, fit
DRAIN_BYTES = 64 * 1024 * 1024
STREAMED = (("PUT", re.compile(r"/v1/uploads/[^/]+")),)  # (method, path): bodies an operation streams

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int = MAX_REQUEST_BODY):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or any(scope["method"] == method and pattern.fullmatch(scope["path"])
                                          for method, pattern in STREAMED):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])  # lower-cased names (ASGI); h11 has checked Content-Length's digits
        declared = headers.get(b"content-length")
        if declared is not None:
            if int(declared) <= self.limit:  # h11 delivers exactly that many bytes, no more
                await self.app(scope, receive, send)
                return
            if headers.get(b"expect", b"").lower() != b"100-continue":  # it is sending: take the rest first
                await _drain(receive, DRAIN_BYTES)
            await self._refuse(send)
            return
        held: list[Message] = []
        size = 0
        while True:
            message = await receive()
            held.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                if message.get("more_body"):
                    await _drain(receive, DRAIN_BYTES - size)
                await self._refuse(send)
                return
            if not message.get("more_body"):
                break

        async def replayed() -> Message:
            return held.pop(0) if held else await receive()

        await self.app(scope, replayed, send)

    async def _refuse(self, send: Send) -> None:
        headers, body = refusal_parts(
            f"the request body is over {self.limit // (1024 * 1024)} MiB; send files as uploads (the CLI and SDK "
            "do), not inside the request", "BodyTooLarge")
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def refusal_parts(message: str, kind: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of the API's JSON refusal, for the layers below FastAPI (here, protocol.py),
    which then close the connection."""
    body = json.dumps({"detail": {"message": message, "kind": kind, "exit_code": EXIT_USAGE}}).encode()
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")], body


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop the rest of a body, up to `budget` bytes."""
    while budget > 0:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return
        budget -= len(message.get("body", b""))
