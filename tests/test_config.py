from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.config import env_number, load_registry
from corral.errors import ConfigError, UnknownClusterError


def write(tmp_path: Path, text: str, name: str = "config") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_hosts_are_clusters_and_patterns_are_not(tmp_path: Path) -> None:
    path = write(tmp_path, """
# team clusters
Host alpha beta
    HostName login.alpha.example
    User me
Host *.internal gamma
    Port=2222
Host !delta *
    ServerAliveInterval 30
Match host foo
    User other
""")
    registry = load_registry(path)
    assert registry.names() == ["alpha", "beta", "gamma"]
    assert registry.get("alpha").hostname == "login.alpha.example"
    assert registry.get("gamma").hostname is None
    assert registry.get("gamma").where == f"{path}:6"


def test_first_block_defines_a_name(tmp_path: Path) -> None:
    path = write(tmp_path, "Host a\n  HostName first\nHost a\n  HostName second\n")
    assert load_registry(path).get("a").hostname == "first"


def test_include_is_followed(tmp_path: Path) -> None:
    write(tmp_path, "Host inc1\n  HostName x\n", name="extra.conf")
    path = write(tmp_path, f"Include {tmp_path}/*.conf\nHost main\n  HostName y\n")
    assert load_registry(path).names() == ["inc1", "main"]


def test_missing_file_names_the_file_and_the_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_registry(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(err.value)
    assert "CORRAL_SLURM_CONFIG" in str(err.value)


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "Host a\n  HostName x\n  Port\n")
    with pytest.raises(ConfigError) as err:
        load_registry(path)
    assert str(err.value).startswith(f"{path}:3: malformed line 'Port'")


def test_file_without_clusters(tmp_path: Path) -> None:
    path = write(tmp_path, "Host *\n  User me\n")
    with pytest.raises(ConfigError, match="no clusters defined"):
        load_registry(path)


def test_unknown_cluster_lists_known_ones(tmp_path: Path) -> None:
    registry = load_registry(write(tmp_path, "Host a b\n"))
    with pytest.raises(UnknownClusterError) as err:
        registry.select(["a", "zzz"])
    assert "'zzz'" in str(err.value) and "a, b" in str(err.value)


def test_select_keeps_order_and_dedups(tmp_path: Path) -> None:
    registry = load_registry(write(tmp_path, "Host a b c\n"))
    assert [e.name for e in registry.select(["c", "a", "c"])] == ["c", "a"]
    assert [e.name for e in registry.select(None)] == ["a", "b", "c"]


def kube_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(text)
    monkeypatch.setenv("CORRAL_HOME", str(home))
    return write(tmp_path, "Host alpine\n")


def test_kubernetes_contexts_are_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = kube_settings(tmp_path, monkeypatch, "kubernetes:\n  allowed_contexts: [gke-ml, kind-dev]\n"
                                                "  namespace: research\n  kubeconfig: /etc/kube/config\n")
    registry = load_registry(path)
    assert registry.names() == ["alpine", "gke-ml", "kind-dev"]
    assert [registry.infra_kind(n) for n in registry.names()] == ["slurm", "k8s", "k8s"]
    context = registry.kube_context("gke-ml")
    assert (context.namespace, context.kubeconfig) == ("research", "/etc/kube/config")
    assert registry.hosts() == ["alpine"]  # a context is no ssh destination


@pytest.mark.parametrize(("text", "message"), [
    ("kubernetes: [a]\n", "must be a mapping"),
    ("kubernetes: {}\n", "allowed_contexts: expected a list"),
    ("kubernetes: {allowed_contexts: [a], contexts: [b]}\n", "unknown setting 'contexts'"),
    ("kubernetes: {allowed_contexts: ['bad name']}\n", "cannot be a place's name"),
    ("kubernetes: {allowed_contexts: [a, a]}\n", "listed twice"),
    ("kubernetes: {allowed_contexts: [a], namespace: Bad_NS}\n", "not a namespace name"),
    ("kubernetes: {allowed_contexts: [a], kubeconfig: [x]}\n", "path of a kubeconfig"),
    ("kubernetes: {allowed_contexts: [alpine]}\n", "also the name of a cluster"),
    # YAML would keep the second block: the first context lost without a word
    ("kubernetes: {allowed_contexts: [a]}\nkubernetes: {allowed_contexts: [b]}\n",
     "kubernetes: written twice in one mapping; merge the two"),
])
def test_bad_kubernetes_settings_say_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
                                                   message: str) -> None:
    path = kube_settings(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError, match=message):
        load_registry(path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
                          lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                  st.dictionaries(st.sampled_from(
                                                      ["allowed_contexts", "namespace", "kubeconfig", "x"]), inner,
                                                      max_size=3)), max_leaves=8))
def test_any_kubernetes_setting_loads_or_says_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             value: object) -> None:
    import yaml

    path = kube_settings(tmp_path, monkeypatch, yaml.safe_dump({"kubernetes": value}))
    try:
        registry = load_registry(path)
    except ConfigError as exc:
        assert "kubernetes" in str(exc)
        return
    assert all(registry.infra_kind(name) in ("slurm", "k8s") for name in registry.names())


@pytest.mark.parametrize("value", ["[slurm, slurm]", "[aws]", "slurm", "[]"])
def test_a_bad_infra_order_says_what_it_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    path = kube_settings(tmp_path, monkeypatch, f"infra_order: {value}\n")
    with pytest.raises(ConfigError, match="'infra_order' must list kinds of place"):
        load_registry(path)


def test_infra_order_fills_in_the_kinds_it_leaves_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.config import infra_order

    kube_settings(tmp_path, monkeypatch, "infra_order: [k8s]\n")
    assert infra_order() == ("k8s", "slurm", "ssh")


@pytest.mark.parametrize("text", ["rpc_budget: 60\n", "rpc_budget: {commands_per_minute: 0}\n",
                                  "rpc_budget: {commands_per_minute: 10, sessions: 2}\n",
                                  "clusters: {alpine: {rpc_budget: {commands_per_minute: many}}}\n"])
def test_a_bad_rpc_budget_says_what_it_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    path = kube_settings(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError, match=r"rpc_budget: expected `\{commands_per_minute: N\}`"):
        load_registry(path)


@pytest.mark.parametrize("raw", ["ten", "nan", "inf", "-1", "1e400", " "])
def test_a_number_setting_says_which_variable_is_wrong_and_its_default(monkeypatch: pytest.MonkeyPatch,
                                                                        raw: str) -> None:
    monkeypatch.setenv("CORRAL_SOMETHING", raw)
    with pytest.raises(ConfigError, match=f"^CORRAL_SOMETHING={raw!r} is not a number of bytes "
                                          r"\(8,589,934,592 by default\)$"):
        env_number("CORRAL_SOMETHING", 8 << 30, unit="bytes")


def test_a_number_setting_unset_or_empty_is_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_SOMETHING", raising=False)
    assert env_number("CORRAL_SOMETHING", 2.5) == 2.5
    monkeypatch.setenv("CORRAL_SOMETHING", "")
    assert env_number("CORRAL_SOMETHING", 2.5) == 2.5
    monkeypatch.setenv("CORRAL_SOMETHING", "0.5")
    assert env_number("CORRAL_SOMETHING", 2.5) == 0.5
    with pytest.raises(ConfigError, match=r"is not a number of seconds, at least 1 \(2\.5 by default\)"):
        env_number("CORRAL_SOMETHING", 2.5, minimum=1)


def test_allowed_clusters_leaves_the_files_other_hosts_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SkyPilot's `slurm: allowed_clusters`: a bastion that ProxyJump names is a Host of the file but no
    cluster, and a pool's machine stays the pool's."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("slurm:\n  allowed_clusters: [borealis, alpine]\npools:\n  lab: {hosts: [gpu1]}\n")
    monkeypatch.setenv("CORRAL_HOME", str(home))
    path = write(tmp_path, "Host alpine\n  ProxyJump bastion\nHost bastion\n  HostName b.example.org\nHost borealis\n"
                           "Host gpu1\n")
    registry = load_registry(path)
    assert registry.names() == ["alpine", "borealis", "lab"]  # file order, as without the setting
    assert "bastion" not in registry.hosts()


@pytest.mark.parametrize("text", ["run_dirs: 7\n", "run_dirs: {keep_days: -1}\n", "run_dirs: {keep_days: yes}\n",
                                  "run_dirs: {keep_days: 7, other: 1}\n", "run_dirs: {}\n"])
def test_a_bad_run_dirs_setting_says_what_to_write(corral_home, text):
    from corral.config import load_user_settings

    corral_home.mkdir(parents=True, exist_ok=True)
    (corral_home / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"setting 'run_dirs': expected `\{keep_days: N\}`, N days from 0 to 36500"):
        load_user_settings()


@pytest.mark.parametrize("text", ["workdir_cache: {keep_days: 0}\n", "workdir_cache: {keep_days: 7, x: 1}\n",
                                  "workdir_cache: 14\n"])
def test_a_bad_workdir_cache_setting_says_what_to_write(corral_home, text):
    from corral.config import load_user_settings
    from corral.run_files import cache_keep_days

    corral_home.mkdir(parents=True, exist_ok=True)
    assert cache_keep_days() == 14.0  # the default
    (corral_home / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"setting 'workdir_cache': expected `\{keep_days: N\}`, N days from 1"):
        load_user_settings()
    (corral_home / "config.yaml").write_text("workdir_cache: {keep_days: 2.5}\n")
    assert cache_keep_days() == 2.5


@pytest.mark.parametrize(("text", "message"), [
    ("slurm: [alpine]\n", "setting 'slurm' takes allowed_clusters only"),
    ("slurm: {clusters: [alpine]}\n", "setting 'slurm' takes allowed_clusters only"),
    ("slurm: {allowed_clusters: []}\n", "slurm.allowed_clusters: expected a list of the cluster file's Host names"),
    ("slurm: {allowed_clusters: ['a b']}\n", "slurm.allowed_clusters: 'a b' cannot be a place's name"),
    ("slurm: {allowed_clusters: [alpine, alpine]}\n", "listed twice"),
    ("slurm: {allowed_clusters: [cirrus]}\n", r"'cirrus' is no Host of .* \(its hosts: alpine\)"),
])
def test_bad_slurm_settings_say_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
                                              message: str) -> None:
    path = kube_settings(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError, match=message):
        load_registry(path)


SETTING_WORDS = ["allowed_contexts", "allowed_clusters", "namespace", "hosts", "gpus", "alpine", "keep_days",
                 "commands_per_minute", "account", "submit_as", "modules", "x"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(__import__("corral.config", fromlist=["x"]).USER_SETTINGS_KEYS)),
       value=st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 10**7), st.floats(allow_nan=True),
                                    st.text(max_size=20), st.sampled_from(SETTING_WORDS)),
                          lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                  st.dictionaries(st.sampled_from(SETTING_WORDS), inner, max_size=3)),
                          max_leaves=8))
def test_any_setting_of_config_yaml_loads_or_says_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 key: str, value: object) -> None:
    """Every setting config.yaml knows, with any value: the registry and every reader of a setting
    either work or raise ConfigError naming the setting; never another exception (a traceback)."""
    import yaml

    from corral import run_files
    from corral.config import infra_order
    from corral.profiles import Profiles

    path = kube_settings(tmp_path, monkeypatch, yaml.safe_dump({key: value}))
    try:
        registry = load_registry(path)
        infra_order()
        run_files.keep_days()
        Profiles.load(registry.names())
    except ConfigError as exc:
        assert key in str(exc), str(exc)
