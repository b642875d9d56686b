"""TCP keepalives: how a connection that may rightly stay quiet for long (a followed log, an exec's
output, a watch) finds a peer that vanished (its host off, the network cut) in about a minute, where a
read without a time limit would otherwise wait for ever. Standard library only (the SDK uses it)."""

from __future__ import annotations

import socket

IDLE_SECONDS = 30  # quiet before the first probe
INTERVAL_SECONDS = 10  # between probes
PROBES = 3  # unanswered before the connection is dead


def socket_options() -> list[tuple[int, int, int]]:
    """(level, option, value) for setsockopt, those this system has: macOS names the idle time
    TCP_KEEPALIVE."""
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for option, value in ((idle, IDLE_SECONDS), (getattr(socket, "TCP_KEEPINTVL", None), INTERVAL_SECONDS),
                          (getattr(socket, "TCP_KEEPCNT", None), PROBES)):
        if option is not None:
            options.append((socket.IPPROTO_TCP, option, value))
    return options


def keep_alive(sock: socket.socket) -> None:
    """Turn `sock`'s keepalives on (socket_options)."""
    for level, option, value in socket_options():
        sock.setsockopt(level, option, value)
