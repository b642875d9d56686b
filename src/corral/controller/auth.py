"""Who is asking: the server's API tokens, the users they stand for, and what each may see.

A request's bearer token is either the server's own token (in `controller.json`, mode 600, readable
only by the Unix account that runs the server: that account's admin, owner "") or a user's token from
`corral users add`, found by its SHA-256. Tokens are 256 random bits, so one SHA-256 is enough to
store them (nothing to guess, unlike a password); the database never holds a token, and no log does.

Optional single sign-on: a trusted reverse proxy (OAuth2 Proxy, for one) that has logged the person
in names them in a header (`--sso-header X-Auth-Request-Email`). The header is believed only from the
proxy's own addresses (`--trusted-proxy`, loopback by default), only for a registered user, and only
when the request has no token. Off unless configured; everything else fails closed (401).

Cost: one indexed query per request with a user's token; none with the server's own.
"""

from __future__ import annotations

import getpass
import hashlib
import ipaddress
import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from enum import Enum
from typing import Annotated

from fastapi import Depends, Request

from corral.errors import ForbiddenError, TaskError
from corral.state import Store
from corral.state.models import UserRow

TOKEN_PREFIX = "corral_"
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}\Z")  # e-mail addresses too (single sign-on)
UNIX_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\Z")
LOOPBACK_PROXIES = ("127.0.0.1/32", "::1/128")  # where single sign-on's header is believed by default


class Role(str, Enum):
    ADMIN = "admin"  # sees and acts on everyone's jobs and allocations; manages users
    USER = "user"  # sees and acts on their own


@dataclass(frozen=True)
class Principal:
    """The user a request acts for."""

    owner: str  # the key their jobs and allocations carry ("" for the server's own account)
    display: str  # who that is, for people and the log
    role: Role
    unix_users: dict[str, str] = field(default_factory=dict)  # cluster -> Unix account there
    local: bool = False  # the server's own account (its token from controller.json)
    service: bool = False
    expires_at: float | None = None

    @property
    def scope(self) -> str | None:
        """Whose objects a listing shows: None (everyone's) for an admin, else the user's own."""
        return None if self.role is Role.ADMIN else self.owner

    def to_json(self) -> dict[str, object]:
        return {"name": self.display, "role": self.role.value, "local": self.local, "service": self.service,
                "unix_users": self.unix_users, "expires_at": self.expires_at}


class UserError(TaskError):
    """A user that cannot be added as asked (bad name, name taken, bad mapping): exit code 65."""


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def local_principal() -> Principal:
    return Principal(owner="", display=getpass.getuser(), role=Role.ADMIN, local=True)


def user_principal(row: UserRow) -> Principal:
    return Principal(owner=row.name, display=row.name, role=Role(row.role), unix_users=json.loads(row.unix_users),
                     service=row.service, expires_at=row.expires_at)


def check_user_name(name: str) -> str:
    if not USER_NAME.match(name):
        raise UserError(f"{name!r} is not a user name: use letters, digits and _ . @ + - (at most 128, "
                        "starting with a letter or digit)")
    return name


def check_unix_users(mapping: Mapping[str, str]) -> dict[str, str]:
    """The user's Unix account on each cluster ({cluster: name}), each name a valid Unix user name."""
    for cluster, name in mapping.items():
        if not cluster or not UNIX_NAME.match(name):
            raise UserError(f"{cluster}={name!r}: expected CLUSTER=UNIX_USER, such as alpine=alice")
    return dict(mapping)


def add_user(store: Store, name: str, role: Role, unix_users: dict[str, str], *, service: bool = False,
             expires_at: float | None = None) -> str:
    """Register a user; returns their token (shown once: only its hash is kept)."""
    from corral.accounts import user_ssh_key

    check_user_name(name)
    token = new_token()
    public, sealed = user_ssh_key(name)  # how the server reaches their accounts (accounts.py)
    row = UserRow(name=name, role=role.value, token_hash=token_hash(token), unix_users=json.dumps(unix_users),
                  service=service, created_at=time.time(), expires_at=expires_at, ssh_public_key=public,
                  ssh_key_sealed=sealed)
    if not store.add_user(row):
        raise UserError(f"a user {name!r} exists already; `corral users remove {name}` first to give a new token")
    return token


@dataclass
class Authenticator:
    store: Store
    server_token: str  # the server's own (controller.json)
    sso_header: str | None = None
    trusted_proxies: InitVar[tuple[str, ...]] = ()  # networks; empty: LOOPBACK_PROXIES

    def __post_init__(self, trusted_proxies: tuple[str, ...]) -> None:
        self._proxies = [ipaddress.ip_network(net, strict=False) for net in trusted_proxies or LOOPBACK_PROXIES]

    def principal(self, authorization: str, headers: Mapping[str, str], client_host: str | None,
                  session: str = "", method: str = "GET") -> Principal:
        """Who the request acts for; raises Unauthenticated (401) for anyone else. `session`: the
        dashboard's cookie (web.py), believed when there is no token; with it, a request that changes
        something must carry the dashboard's header too (a cross-site form cannot)."""
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() == "bearer" and given:
            if secrets.compare_digest(given.encode(), self.server_token.encode()):
                return local_principal()
            row = self.store.user_by_token_hash(token_hash(given))
            if row is None:
                raise Unauthenticated("missing or wrong token")
            if row.expires_at is not None and row.expires_at <= time.time():
                raise Unauthenticated(f"the token of {row.name} expired; ask an admin for a new one")
            return user_principal(row)
        if session:
            from corral.controller.web import CSRF_HEADER, session_owner

            owner = session_owner(self.store, session)
            if owner is not None and (method in ("GET", "HEAD") or headers.get(CSRF_HEADER.lower())):
                if owner == "":
                    return local_principal()
                row = self.store.user(owner)
                if row is not None:
                    return user_principal(row)
        if self.sso_header and self._from_trusted_proxy(client_host):
            name = headers.get(self.sso_header.lower(), "").strip()
            row = self.store.user(name) if name and USER_NAME.match(name) else None
            if row is not None and not row.service:
                return user_principal(row)
            if name:
                raise Unauthenticated(f"{name!r} (from {self.sso_header}) is not a user of this server")
        raise Unauthenticated("missing or wrong token")

    def _from_trusted_proxy(self, host: str | None) -> bool:
        try:
            address = ipaddress.ip_address(host or "")
        except ValueError:
            return False
        return any(address in net for net in self._proxies)


class Forbidden(ForbiddenError):
    """Answered 403."""


def require_admin(me: Principal, what: str) -> None:
    if me.role is not Role.ADMIN:
        raise Forbidden(f"{what} is for admins; {me.display} is a {me.role.value}")


def owner_of_all(me: Principal, every: bool, every_user: bool) -> str | None:
    """Whose live objects an `all` request (`every`) names: the caller's own, even an admin's; everyone's
    (None) only when an admin asks for every user's too (`every_user`, SkyPilot's `--all-users`)."""
    if every_user:
        require_admin(me, "acting on every user's jobs")
        if not every:
            raise TaskError("`all_users` goes with `all`: name the jobs, or ask for all of them")
        return None
    return me.owner


def _principal(request: Request) -> Principal:
    return request.state.principal  # set by the app's authentication (api.py) before any route runs


Me = Annotated[Principal, Depends(_principal)]  # a route's parameter: the user the request acts for


class Unauthenticated(Exception):
    """No valid credentials: answered 401, with no detail about which users exist."""
