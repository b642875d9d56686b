"""corral.sdk.transport with stand-in HTTP servers on loopback: what the client's timeout bounds, and the
keepalives of a streamed answer's connection. (A job followed past the timeout on the testbed:
tests/sdk/test_client.py.)"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from corral.keepalive import IDLE_SECONDS
from corral.sdk import Client, ServerUnreachableError
from corral.sdk import endpoint as _endpoint
from corral.sdk import transport


class _Quiet(http.server.BaseHTTPRequestHandler):
    """Headers and a chunk at once, then a quiet second (longer than the clients' timeout), then a last
    chunk; with `silent`, no answer at all for that second."""

    protocol_version = "HTTP/1.1"
    silent = False

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.silent:
            time.sleep(1.0)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index, chunk in enumerate((b"before\n", b"after\n")):
            if index:
                time.sleep(1.0)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stand_in(request) -> Iterator[str]:
    handler = type("Handler", (_Quiet,), {"silent": getattr(request, "param", False)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_streamed_answer_may_stay_quiet_longer_than_the_timeout(stand_in):
    client = Client(url=stand_in, token="t", timeout=0.3)
    assert b"".join(client.logs("c-quiet", follow=True)) == b"before\nafter\n"


def test_a_plain_answer_is_still_read_within_the_timeout(stand_in):
    point = _endpoint.Endpoint(url=stand_in, token="t", local=True)
    with transport.opener(point).open(f"{stand_in}/v1/x", timeout=0.3) as answer:
        with pytest.raises(TimeoutError):
            answer.read()


@pytest.mark.parametrize("stand_in", [True], indirect=True)
def test_a_streamed_answers_headers_must_come_within_the_timeout(stand_in):
    client = Client(url=stand_in, token="t", timeout=0.3)
    with pytest.raises(ServerUnreachableError, match="did not answer"):
        list(client.logs("c-quiet", follow=True))


def test_a_streamed_answers_connection_has_tcp_keepalives_and_a_plain_ones_not(stand_in):
    """What ends the wait of a streamed read whose server's host vanished."""
    point = _endpoint.Endpoint(url=stand_in, token="t", local=True)

    def keepalive(streamed: bool) -> tuple[int, int]:
        with transport.opener(point, streamed=streamed).open(f"{stand_in}/v1/x", timeout=5) as answer:
            sock = answer.fp.raw._sock
            return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE))

    assert keepalive(True) == (1, IDLE_SECONDS)
    assert keepalive(False)[0] == 0
