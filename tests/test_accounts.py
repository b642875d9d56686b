"""accounts.py without a cluster: which places a team server's members may use, and as whom. Pools and
Kubernetes contexts run every member's tasks as one account, so members reach them only where
`submit_as` is `service`; per-member modes named for them are refused when the server starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral import accounts
from corral.errors import ConfigError, NoAccountError
from tests.conftest import refusing_cluster_file


@pytest.fixture
def places(corral_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two clusters, the pool `lab` and the context `kind-dev`; yields a writer of config.yaml's team settings."""
    monkeypatch.setenv("CORRAL_SLURM_CONFIG", str(refusing_cluster_file(tmp_path)))
    corral_home.mkdir(parents=True, exist_ok=True)

    def settings(**team: object) -> accounts.SubmitSettings:
        (corral_home / "config.yaml").write_text(json.dumps({
            "pools": {"lab": {"hosts": ["gpu1", "gpu2"]}},
            "kubernetes": {"allowed_contexts": ["kind-dev"]}, **team}))
        return accounts.team_settings()
    return settings


class _NoStore:
    """login() must decide about a one-account place before it reads the user's row."""

    def user(self, name: str) -> None:
        raise AssertionError(f"the store was read for {name}")


def test_pools_and_contexts_are_one_account_places(places):
    settings = places()
    assert set(settings.one_account) == {"lab", "kind-dev"}
    assert settings.one_account["lab"].startswith("an SSH pool")
    assert settings.one_account["kind-dev"].startswith("a Kubernetes context")
    assert settings.describe("alpine") == "ssh"
    assert settings.describe("lab").startswith("members refused")


def test_members_are_refused_on_a_one_account_place_unless_it_is_service(places):
    team = accounts.TeamAccounts(_NoStore(), places(submit_as="sudo"))  # type: ignore[arg-type]
    for place, what in (("lab", "an SSH pool"), ("kind-dev", "a Kubernetes context")):
        with pytest.raises(NoAccountError) as refused:
            team.login("alice", place)
        message = str(refused.value)
        assert refused.value.cluster == place and f"{place} is {what}" in message, message
        assert f"`clusters: {{{place}: {{submit_as: service}}}}`" in message, message
        assert team.cluster_users(place) == []
    assert team.login("", "lab") is None  # the server's own account: the one the pool runs as

    lab_shared = places(clusters={"lab": {"submit_as": "service"}})
    allowed = accounts.TeamAccounts(_NoStore(), lab_shared)  # type: ignore[arg-type]
    assert allowed.login("alice", "lab") is None  # as the pool's account
    assert allowed.settings.describe("lab") == "service"
    with pytest.raises(NoAccountError):
        allowed.login("alice", "kind-dev")  # the default (ssh) still refuses the other one
    everyone = accounts.TeamAccounts(_NoStore(), places(submit_as="service"))  # type: ignore[arg-type]
    assert everyone.login("alice", "kind-dev") is None


@pytest.mark.parametrize("mode", ["ssh", "sudo"])
def test_a_per_member_mode_named_for_a_pool_or_context_is_a_config_error(places, mode):
    for place in ("lab", "kind-dev"):
        with pytest.raises(ConfigError) as refused:
            places(clusters={place: {"submit_as": mode}})
        message = str(refused.value)
        assert f"clusters.{place}.submit_as: {mode}" in message and "only `service` can be set" in message, message
        assert "config.yaml" in message, message
    # The same for a cluster is what it says: that member's own account there.
    assert places(clusters={"alpine": {"submit_as": mode}}).mode("alpine").value == mode
