"""How the SDK's requests reach the server: the opener for a server (proxy, TLS), and the connections of
streamed answers, whose body may rightly stay quiet for as long as a job does.

A request must connect and get its answer's headers within the client's timeout. A plain answer's
body is read within it too. A streamed one (a followed log, an exec's output, a launch's events) is
read for as long as it lasts: a job or an exec's command that prints nothing for minutes is not a
server that stopped answering. A server that died closes the connection, which ends the read; one
whose host vanished is found by TCP keepalives in about a minute (corral.keepalive), as kubectl's and
ssh's reads find theirs. Standard library only.
"""

from __future__ import annotations

import http.client
import urllib.request
from typing import Any

from corral.keepalive import keep_alive
from corral.sdk import endpoint as _endpoint


def opener(point: _endpoint.Endpoint, *, streamed: bool = False) -> urllib.request.OpenerDirector:
    """How requests reach the server. A remote one through the proxy the environment names (HTTPS_PROXY,
    NO_PROXY, …), as other HTTP clients do; this machine's own server never: a proxy cannot reach the
    user's loopback, and urllib would send even 127.0.0.1 to it unless NO_PROXY says otherwise.
    `streamed`: the answer's body is read without a time limit, on a connection kept alive by TCP."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})] if point.local else []
    context = tls_context(point)
    if streamed:
        handlers += [_StreamedHTTPHandler(), _StreamedHTTPSHandler(context=context)]
    elif context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def tls_context(point: _endpoint.Endpoint) -> Any:
    """For this machine's team server over HTTPS: trust exactly the certificate it serves (its address
    here is loopback, which the certificate does not name). Otherwise the system's trust store
    (SSL_CERT_FILE for a private CA)."""
    if not point.cafile:
        return None
    import ssl

    context = ssl.create_default_context(cafile=point.cafile)
    context.check_hostname = False  # pinned to the one certificate instead
    return context


class _StreamedBody:
    """A connection (mixed into http.client's) whose socket has TCP keepalives, and whose timeout, once
    the answer's headers are in, is lifted for the body."""

    sock: Any

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        keep_alive(self.sock)

    def getresponse(self) -> http.client.HTTPResponse:
        sock = self.sock  # (http.client lets go of it once the answer is in: the answer reads on through it)
        response: http.client.HTTPResponse = super().getresponse()  # type: ignore[misc]
        if sock is not None:
            sock.settimeout(None)
        return response


class _StreamedHTTPConnection(_StreamedBody, http.client.HTTPConnection):
    pass


class _StreamedHTTPSConnection(_StreamedBody, http.client.HTTPSConnection):
    pass


class _StreamedHTTPHandler(urllib.request.HTTPHandler):
    def do_open(self, http_class: Any, req: urllib.request.Request, **kwargs: Any) -> http.client.HTTPResponse:
        return super().do_open(_StreamedHTTPConnection, req, **kwargs)


class _StreamedHTTPSHandler(urllib.request.HTTPSHandler):
    def do_open(self, http_class: Any, req: urllib.request.Request, **kwargs: Any) -> http.client.HTTPResponse:
        return super().do_open(_StreamedHTTPSConnection, req, **kwargs)  # the arguments this Python passes
