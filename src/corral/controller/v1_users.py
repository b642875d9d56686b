"""The `/v1` routes about people: who you are (`/me`), and a team server's users and service accounts
(`/users`, admins only). A new user's token is in the answer that creates it, and nowhere else: the
store keeps its SHA-256 (auth.py)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import Field

from corral.accounts import ensure_ssh_key, one_account_places
from corral.config import load_registry
from corral.controller.auth import (
    Me,
    Role,
    UserError,
    add_user,
    check_unix_users,
    require_admin,
    user_principal,
)
from corral.controller.refusals import RequestBody
from corral.errors import NotFoundError
from corral.state import Store

UserName = Annotated[str, Path(min_length=1, max_length=128)]


class NewUser(RequestBody):
    # checked by auth.check_user_name, whose message says what a name may hold (the bound keeps bodies small)
    name: Annotated[str, Field(max_length=1024)]
    role: Role = Field(Role.USER, strict=False)  # its value, as JSON gives it
    unix_users: dict[Annotated[str, Field(min_length=1, max_length=256)],
                     Annotated[str, Field(min_length=1, max_length=32)]] = Field(default_factory=dict, max_length=1000)
    service: bool = Field(False, description="A service account (CI, bots): a token that expires")
    expires_in_days: float | None = Field(None, gt=0, le=3650, description="The token stops working after this")


class UserChange(RequestBody):
    unix_users: dict[Annotated[str, Field(min_length=1, max_length=256)],
                     Annotated[str, Field(min_length=1, max_length=32)]] = Field(
        max_length=1000, description="The user's Unix account on each cluster (replaces the mapping)")


def _checked_unix_users(mapping: dict[str, str]) -> dict[str, str]:
    unix_users = check_unix_users(mapping)
    registry = load_registry()
    known = registry.names()
    unknown = sorted(set(unix_users) - set(known))
    if unknown:
        raise UserError(f"--unix-user names no cluster of this server: {', '.join(map(repr, unknown))} "
                        f"(its clusters: {', '.join(known) or 'none'})")
    shared = one_account_places(registry)
    refused = sorted(set(unix_users) & set(shared))
    if refused:
        name = refused[0]
        raise UserError(f"--unix-user {name}=…: {name} is {shared[name]}, where members' tasks run as that one "
                        f"account, not their own: it takes no mapping (an admin lets members use it with "
                        f"`clusters: {{{name}: {{submit_as: service}}}}` in the server's config.yaml)")
    return unix_users


def add_routes(router: APIRouter, store: Store) -> None:
    @router.get("/me")
    async def me(me: Me) -> dict[str, object]:
        """Who the request's token stands for: name, role, Unix accounts per cluster, and the public key
        the server reaches those accounts with (to add to `~/.ssh/authorized_keys` there)."""
        row = None if me.local else ensure_ssh_key(store, me.owner)
        return {**me.to_json(), "ssh_public_key": row.ssh_public_key if row else None}

    @router.get("/users")
    async def users(me: Me) -> dict[str, object]:
        """The server's users (admins only); never their tokens."""
        require_admin(me, "listing users")
        return {"users": [{**user_principal(row).to_json(), "created_at": row.created_at} for row in store.users()]}

    @router.post("/users")
    async def new_user(me: Me, request: NewUser) -> dict[str, object]:
        """Add a user or a service account (admins only). The answer holds its token, shown this once."""
        require_admin(me, "adding users")
        unix_users = _checked_unix_users(request.unix_users)
        if request.service and request.expires_in_days is None:
            raise UserError("a service account's token must expire: give expires_in_days (`--expires DAYS`)")
        expires_at = time.time() + request.expires_in_days * 86400 if request.expires_in_days else None
        token = add_user(store, request.name, request.role, unix_users, service=request.service,
                         expires_at=expires_at)
        print(f"user {request.name} ({request.role.value}) added by {me.display}", flush=True)
        row = store.user(request.name)
        return {"name": request.name, "token": token, "role": request.role.value, "expires_at": expires_at,
                "unix_users": unix_users, "ssh_public_key": row.ssh_public_key if row else None}

    @router.patch("/users/{name}")
    async def change_user(me: Me, name: UserName, request: UserChange) -> dict[str, object]:
        """Set a user's Unix account per cluster (admins only); the user's token stays the same."""
        require_admin(me, "changing users")
        unix_users = _checked_unix_users(request.unix_users)
        if not store.set_unix_users(name, unix_users):
            raise NotFoundError(f"no user {name!r}")
        print(f"user {name}: unix accounts set to {unix_users} by {me.display}", flush=True)
        return {"name": name, "unix_users": unix_users}

    @router.delete("/users/{name}")
    async def remove_user(me: Me, name: UserName) -> dict[str, object]:
        """Remove a user (admins only): their token stops working at once; their jobs stay."""
        require_admin(me, "removing users")
        removed = store.remove_user(name)
        if removed:
            print(f"user {name} removed by {me.display}", flush=True)
        return {"name": name, "removed": removed}
