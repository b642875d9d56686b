"""The HTTP/1.1 protocol the API serves: uvicorn's h11 protocol, mended for a request it cannot read
(a line and headers over `h11_max_incomplete_event_size`, or a malformed head) and for one that never
finishes its head.

uvicorn answered such a request with a text/plain 400 and closed the socket at once, the rest of the
request unread, so the kernel reset the connection and the client usually lost the answer
(`Connection reset by peer` while reading it). Here the answer is the API's JSON refusal (`Refused`,
with a status the OpenAPI document declares: 431 for a head too long, 400 otherwise) and the close
lingers, as nginx's does: the rest of the request is read and dropped until the client closes, for at
most LINGER_SECONDS and LINGER_BYTES.

uvicorn also kept a connection open for ever while its request line and headers had not all come: a
new connection that sent nothing, or one that sent a header line every few seconds. Enough of them
would use up the server's file descriptors, which its ssh connections to the clusters need too. Here
a request's head must be complete within `CORRAL_REQUEST_HEAD_SECONDS` (30) of the connection, or of
its first byte on a kept-alive connection, or the connection is closed, as nginx's
`client_header_timeout` does.

A request's body is held to a minimum rate in the same way (Apache's `mod_reqtimeout` body rule, in
windows rather than with credit): while a body is coming, each `CORRAL_REQUEST_BODY_SECONDS` (30) must
bring at least BODY_MIN_RATE bytes a second of it, or the connection is closed and the operation sees
the client gone. Otherwise a client that trickles a byte now and then holds its connection (and
what the server has read of its body) for ever. A window in which the server itself stopped reading
(the operation had not taken what came before) does not count. Cost: one timer per request head,
and one per window of a body."""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from corral.config import env_number
from corral.controller.bodylimit import refusal_parts

# Bytes of a request's line and headers; more is refused with 431. h11's default (16 KiB) would refuse a
# query the API allows: `GET /v1/dev/{name}/ssh?command=` up to 8,192 characters, 12 bytes each when
# percent-encoded. h11 counts only what it holds while waiting for more, so a longer head that arrives
# whole may still be read.
MAX_REQUEST_HEAD = 256 * 1024
LINGER_SECONDS = 5.0
LINGER_BYTES = 16 * 1024 * 1024
BODY_MIN_RATE = 500  # bytes a second: Apache's mod_reqtimeout default (4 kbit/s)


def head_seconds() -> float:
    return env_number("CORRAL_REQUEST_HEAD_SECONDS", 30.0, minimum=1)


def body_window_seconds() -> float:
    return env_number("CORRAL_REQUEST_BODY_SECONDS", 30.0, minimum=1)


class RefusingH11Protocol(H11Protocol):
    _lingering = False
    _dropped = 0
    _head_deadline: asyncio.TimerHandle | None = None
    _body_window: asyncio.TimerHandle | None = None
    _body_bytes = 0  # received in the current window

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if not self._lingering:
            super().data_received(data)
            self._await_head()
            self._await_body(len(data))
            return
        self._dropped += len(data)
        if self._dropped > LINGER_BYTES:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_deadline, self._body_window):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        """Keep a deadline running while a request's head is still coming, and only then."""
        waiting = self.conn.their_state is h11.IDLE and not self._lingering and not self.transport.is_closing()
        if waiting and self._head_deadline is None:
            self._head_deadline = self.loop.call_later(head_seconds(), self._head_overdue)
        elif not waiting and self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_overdue(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self._lingering:
            self.transport.close()

    def _await_body(self, received: int) -> None:
        """Count a body's bytes, and keep its windows running while it is coming, and only then."""
        if not self._sending_body():
            if self._body_window is not None:
                self._body_window.cancel()
                self._body_window = None
        elif self._body_window is None:
            self._body_bytes = 0
            self._body_window = self.loop.call_later(body_window_seconds(), self._body_window_ended)
        else:
            self._body_bytes += received

    def _sending_body(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY and not self._lingering and not self.transport.is_closing()

    def _body_window_ended(self) -> None:
        self._body_window = None
        if not self._sending_body():
            return
        window = body_window_seconds()
        if self._body_bytes < BODY_MIN_RATE * window and not self.flow.read_paused:
            self.transport.close()  # the operation reading the body sees the client gone
            return
        self._body_bytes = 0
        self._body_window = self.loop.call_later(window, self._body_window_ended)

    def send_400_response(self, msg: str) -> None:
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):  # an answer has begun: nothing to add
            self.transport.close()
            return
        limit = self.config.h11_max_incomplete_event_size
        if len(self.conn.trailing_data[0]) > limit:
            status, kind = 431, "RequestTooLarge"
            message = (f"the request's line and headers are over {limit // 1024} KiB; send fewer or shorter "
                       "query values, or put them in a POST body")
        else:
            status, kind = 400, "MalformedRequest"
            message = "the request is not valid HTTP/1.1; nothing was done"
        headers, body = refusal_parts(message, kind)
        for event in (h11.Response(status_code=status, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self._lingering = True
        if self.transport.can_write_eof():  # TLS cannot half-close; Content-Length ends the answer anyway
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)
