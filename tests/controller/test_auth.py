"""Who a request acts for (controller/auth.py), against a store on a real PostgreSQL: the server's own
token, users' tokens (kept hashed, expiring, removable) and single sign-on through a trusted proxy's
header, which fails closed."""

from __future__ import annotations

import time

import pytest

from corral.controller.auth import (
    Authenticator,
    Role,
    Unauthenticated,
    UserError,
    add_user,
    check_unix_users,
    token_hash,
)
from corral.state import Store


@pytest.fixture
def store(fresh_postgres) -> Store:
    store = Store(fresh_postgres)
    yield store
    store.engine.dispose()


def bearer(token: str) -> str:
    return f"Bearer {token}"


def test_the_servers_own_token_is_its_accounts_admin(store):
    auth = Authenticator(store, "server-token")
    me = auth.principal(bearer("server-token"), {}, "10.1.2.3")
    assert (me.owner, me.role, me.local, me.scope) == ("", Role.ADMIN, True, None)
    for wrong in ("", "Bearer", "Bearer server-toke", "Basic server-token", bearer("server-token-and-more")):
        with pytest.raises(Unauthenticated):
            auth.principal(wrong, {}, "127.0.0.1")


def test_a_users_token_is_stored_hashed_and_stops_when_removed(store):
    token = add_user(store, "ada", Role.USER, {"alpine": "ada"})
    row = store.user("ada")
    assert row.token_hash == token_hash(token) and token not in row.token_hash
    auth = Authenticator(store, "server-token")
    me = auth.principal(bearer(token), {}, None)
    assert (me.owner, me.role, me.local, me.scope, me.unix_users) == ("ada", Role.USER, False, "ada",
                                                                      {"alpine": "ada"})
    with pytest.raises(UserError, match="exists already"):
        add_user(store, "ada", Role.ADMIN, {})
    assert store.remove_user("ada") and not store.remove_user("ada")
    with pytest.raises(Unauthenticated):
        auth.principal(bearer(token), {}, None)


def test_an_expired_token_is_refused(store):
    token = add_user(store, "ci", Role.USER, {}, service=True, expires_at=time.time() - 1)
    with pytest.raises(Unauthenticated, match="expired"):
        Authenticator(store, "s").principal(bearer(token), {}, None)
    later = add_user(store, "ci2", Role.USER, {}, service=True, expires_at=time.time() + 3600)
    assert Authenticator(store, "s").principal(bearer(later), {}, None).service


def test_single_sign_on_believes_only_its_proxy_and_only_for_registered_people(store):
    add_user(store, "ada@example.org", Role.USER, {})
    add_user(store, "bot", Role.USER, {}, service=True, expires_at=time.time() + 3600)
    token = add_user(store, "bob", Role.USER, {})
    header = {"x-auth-request-email": "ada@example.org"}
    off = Authenticator(store, "s")
    with pytest.raises(Unauthenticated):
        off.principal("", header, "127.0.0.1")  # off unless configured
    sso = Authenticator(store, "s", sso_header="X-Auth-Request-Email", trusted_proxies=("10.0.0.0/24",))
    assert sso.principal("", header, "10.0.0.7").owner == "ada@example.org"
    for host in ("10.0.1.7", "127.0.0.1", None, "not an address"):
        with pytest.raises(Unauthenticated):
            sso.principal("", header, host)  # not the proxy: anyone could send the header
    for name in ("mallory@example.org", "bot", "", "a\nb"):
        with pytest.raises(Unauthenticated):
            sso.principal("", {"x-auth-request-email": name}, "10.0.0.7")
    assert sso.principal(bearer(token), header, "10.0.0.7").owner == "bob"  # a token wins over the header


def test_user_names_and_unix_accounts_are_checked():
    with pytest.raises(UserError, match="not a user name"):
        add_user(None, "../etc", Role.USER, {})  # type: ignore[arg-type] - refused before the store is used
    assert check_unix_users({"alpine": "ada", "cirrus": "a.lovelace"}) == {"alpine": "ada", "cirrus": "a.lovelace"}
    # (a pair without "=" never reaches the server: the CLI refuses it, see test_team.py)
    for cluster, bad in (("", "ada"), ("alpine", ""), ("alpine", "Ada"), ("alpine", "ada;rm"), ("alpine", "a" * 40)):
        with pytest.raises(UserError, match="CLUSTER=UNIX_USER"):
            check_unix_users({cluster: bad})
