"""Whose Unix account a team server's jobs reach Slurm as.

Per cluster, the server's settings (`submit_as` in its `~/.corral/config.yaml`, for all clusters or per
cluster under `clusters: {NAME: {submit_as: …}}`) choose how a user's jobs get there:

- `ssh` (the default on a team server): as the user's own account, reached with a key the server keeps
  for that user (made with the user, the private half sealed in the store). The user authorizes its
  public half (`corral api ssh-key`) in `~/.ssh/authorized_keys` on each cluster. One ControlMaster per
  user and cluster.
- `sudo`: the service account (the cluster file's `User`) runs each of Corral's scripts as the user with
  `sudo -n -u USER`, which a sudoers rule limited to the team's accounts allows (docs/sudoers.example).
  One connection serves everyone.
- `service`: everyone's jobs run as the service account itself, for teams allowed one shared account.

A user is refused on a cluster where no Unix account is mapped for them (`corral users add/set
--unix-user CLUSTER=NAME`), and placement skips it: multi-user code fails closed.

SSH pools and Kubernetes contexts have no per-member account: a pool's GPU claims and queue live in the
home of the one account Corral reaches its machines with (a member's own account would claim GPUs that
the others' cannot see, and its queue could not start their tasks), and a context is reached with the
server's kubeconfig. So members use them only where `submit_as` is `service` for them (set for that
place or as the default); otherwise they are refused there, and `ssh` or `sudo` named for one is a
ConfigError. The server's own
account (owner "") is the service account. The inventory (`sinfo`) and everyone's job status (one
`squeue -u svc,alice,bob` per cluster per tick) go through the service account.

Cost: one indexed query per user and cluster per `Client` (a request or a tick); a key file is written once.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from corral.config import corral_home, write_private
from corral.errors import ConfigError, NoAccountError

if TYPE_CHECKING:
    from corral.config import ClusterRegistry
    from corral.state import Store
    from corral.state.models import UserRow


class SubmitMode(enum.StrEnum):
    SSH = "ssh"  # the user's own account, with the server's key for them
    SUDO = "sudo"  # the service account, `sudo -n -u USER` on the login node
    SERVICE = "service"  # the service account itself, for everyone


@dataclass(frozen=True)
class Login:
    """How to act as one user on one cluster."""

    user: str  # the Unix account there
    mode: SubmitMode  # SSH or SUDO
    identity: Path | None = None  # SSH: the private key file (mode 600)


@dataclass(frozen=True)
class SubmitSettings:
    """The `submit_as` settings: a default and per-cluster choices."""

    default: SubmitMode = SubmitMode.SSH
    clusters: dict[str, SubmitMode] = field(default_factory=dict)
    one_account: dict[str, str] = field(default_factory=dict)  # pool or context -> what it is (one_account_places)

    def mode(self, cluster: str) -> SubmitMode:
        return self.clusters.get(cluster, self.default)

    def describe(self, cluster: str) -> str:
        """The place's mode as the server's log says it: `members refused` for a one-account place whose
        mode is not `service`."""
        mode = self.mode(cluster)
        if cluster in self.one_account and mode is not SubmitMode.SERVICE:
            return "members refused (one account: submit_as service lets them in)"
        return mode.value

    @classmethod
    def from_settings(cls, settings: dict[str, object], where: Path | None = None) -> SubmitSettings:
        """From the parsed settings file: `submit_as: ssh|sudo|service`, `clusters: {NAME: {submit_as: …}}`."""
        default = _mode(settings.get("submit_as", SubmitMode.SSH.value), "submit_as", where)
        clusters: dict[str, SubmitMode] = {}
        for name, options in dict(settings.get("clusters") or {}).items():  # type: ignore[call-overload]
            if isinstance(options, dict) and "submit_as" in options:
                clusters[str(name)] = _mode(options["submit_as"], f"clusters.{name}.submit_as", where)
        return cls(default, clusters)

    def check_clusters(self, known: list[str], where: Path | None = None) -> None:
        """A setting for a cluster the server does not have is a typo: refuse it (it would fall back
        to the default silently)."""
        unknown = sorted(set(self.clusters) - set(known))
        if unknown:
            raise ConfigError(f"clusters: {', '.join(map(repr, unknown))} is not a cluster of this server "
                              f"(its clusters: {', '.join(known)})", where)

    def check_one_account(self, where: Path | None = None) -> None:
        """`ssh` or `sudo` named for a pool or a context would promise members their own accounts
        there, which Corral cannot give: refuse it."""
        for name, what in self.one_account.items():
            mode = self.clusters.get(name, SubmitMode.SERVICE)
            if mode is not SubmitMode.SERVICE:
                raise ConfigError(f"clusters.{name}.submit_as: {mode.value}: {name} is {what}, where every member's "
                                  "tasks run as that one account: only `service` can be set for it (or leave it "
                                  "out, and members are refused there unless the default is `service`)", where)


def _mode(value: object, key: str, where: Path | None) -> SubmitMode:
    try:
        return SubmitMode(value)
    except ValueError:
        choices = ", ".join(m.value for m in SubmitMode)
        raise ConfigError(f"{key}: {value!r} is not one of {choices}", where) from None


class Accounts(Protocol):
    def login(self, owner: str, cluster: str) -> Login | None:
        """How to act as `owner` on `cluster`; None: as the service account. Raises NoAccountError."""
        ...

    def cluster_users(self, cluster: str) -> list[str]:
        """The Unix accounts on `cluster` whose jobs the server tracks, besides the service account's."""
        ...


def new_ssh_key(comment: str) -> tuple[str, str]:
    """(public line for authorized_keys, private key in OpenSSH format): a fresh Ed25519 key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return f"{public} {comment}", private


def user_ssh_key(user: str) -> tuple[str, str]:
    """A new key for the server to reach `user`'s accounts: (public line, private half sealed)."""
    from corral.state.sealed import seal

    public, private = new_ssh_key(f"corral-team:{user}")
    return public, seal({"private": private}) or ""


def ensure_ssh_key(store: Store, name: str) -> UserRow | None:
    """The user's row with a key (one is made and stored for users added before keys existed)."""
    row = store.user(name)
    if row is None or row.ssh_public_key:
        return row
    store.set_user_key(name, *user_ssh_key(name))
    return store.user(name)


def identity_file(name: str, public: str, sealed: str) -> Path:
    """The user's private key as a file ssh can use (mode 600, under the server's home), written once."""
    from corral.state.sealed import unseal

    digest = hashlib.sha256(f"{name}\0{public}".encode()).hexdigest()[:20]
    path = corral_home() / "identities" / digest
    if not path.exists():
        write_private(path, unseal(sealed)["private"])
    return path


class TeamAccounts:
    """A team server's answer, from its users (the store) and its `submit_as` settings."""

    def __init__(self, store: Store, settings: SubmitSettings):
        self.store = store
        self.settings = settings

    def login(self, owner: str, cluster: str) -> Login | None:
        mode = self.settings.mode(cluster)
        if not owner or mode is SubmitMode.SERVICE:
            return None
        what = self.settings.one_account.get(cluster)
        if what is not None:
            raise NoAccountError(cluster, f"{cluster} is {what}, where every member's tasks would run as that one "
                                          "account, and this server does not let members share it: an admin allows "
                                          f"it with `clusters: {{{cluster}: {{submit_as: service}}}}` in the "
                                          "server's config.yaml")
        row = self.store.user(owner)  # not cached: a Client asks once per (cluster, owner)
        if row is None:
            raise NoAccountError(cluster, f"{owner} is no longer a user of this server")
        user = json.loads(row.unix_users).get(cluster)
        if not user:
            raise NoAccountError(cluster, f"{owner} has no account on {cluster}: an admin maps one with "
                                          f"`corral users set {owner} --unix-user {cluster}=UNIX_USER`")
        if mode is SubmitMode.SUDO:
            return Login(user, mode)
        if not row.ssh_public_key or not row.ssh_key_sealed:
            row = ensure_ssh_key(self.store, owner)
            assert row is not None and row.ssh_public_key and row.ssh_key_sealed
        return Login(user, mode, identity_file(owner, row.ssh_public_key, row.ssh_key_sealed))

    def cluster_users(self, cluster: str) -> list[str]:
        if self.settings.mode(cluster) is SubmitMode.SERVICE or cluster in self.settings.one_account:
            return []
        return sorted({user for row in self.store.users()
                       for c, user in json.loads(row.unix_users).items() if c == cluster})


def team_settings() -> SubmitSettings:
    """A team server's `submit_as` settings, checked against its clusters (ConfigError if wrong)."""
    from corral.config import load_registry, load_user_settings, settings_path

    registry = load_registry()
    settings = SubmitSettings.from_settings(load_user_settings(), settings_path())
    settings.check_clusters(registry.names(), settings_path())
    settings = dataclasses.replace(settings, one_account=one_account_places(registry))
    settings.check_one_account(settings_path())
    return settings


_ONE_ACCOUNT_KINDS = {
    "ssh": "an SSH pool (its machines' GPU claims and queue live in the home of the one account Corral reaches "
           "them with)",
    "k8s": "a Kubernetes context (reached with the server's kubeconfig)",
}


def one_account_places(registry: ClusterRegistry) -> dict[str, str]:
    """The places with no per-member account (pools and contexts), each with what it is."""
    return {name: _ONE_ACCOUNT_KINDS[kind] for name in registry.names()
            if (kind := registry.infra_kind(name)) in _ONE_ACCOUNT_KINDS}


_installed: Accounts | None = None


def install(accounts: Accounts | None) -> None:
    """Make `accounts` what every Client of this process acts through (a team server, at start)."""
    global _installed
    _installed = accounts


def installed() -> Accounts | None:
    """None outside a team server: everything acts as the user's own ssh config says."""
    return _installed
