"""The cluster registry: the `Host` entries of ~/.slurm/config, the SSH pools of ~/.corral/config.yaml,
and where Corral keeps its files.

The file is OpenSSH client syntax and is handed to `ssh -F` as is, so every ssh option works
(ProxyJump, IdentityFile, Port, User, ...). Corral itself only reads which Host names it defines: each
concrete Host name is a Slurm cluster's login node, unless a pool names it or `slurm: {allowed_clusters:
[…]}` of config.yaml leaves it out (a bastion); patterns (`*`, `?`, `!`) only carry options for the
others. A pool (`pools: {lab: {hosts: [gpu1, gpu2]}}`) is a set of plain
machines reached the same way (`ssh -F` the cluster file): its hosts are Host entries there or plain
host names. Kubernetes contexts (`kubernetes: {allowed_contexts: [ctx]}`) of the user's kubeconfig are
places too. The places work can go are the clusters, the pools and the contexts (`names()`); each has an
infra kind (`infra_kind()`: slurm, ssh, k8s).
"""

from __future__ import annotations

import glob
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from corral.errors import ConfigError, UnknownClusterError

CLUSTER_FILE_ENV = "CORRAL_SLURM_CONFIG"
HOME_ENV = "CORRAL_HOME"
TIMEOUT_ENV = "CORRAL_TIMEOUT"
DEFAULT_TIMEOUT = 10.0  # seconds: the most Corral waits for a login node that stops answering
# A cluster name is also a path component (`slurm/<cluster>/<partition>`) and an ssh/rsync argument.
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+\-]*\Z", re.ASCII)
_KEYWORD = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+)(.*?)\s*$")
_MAX_INCLUDE_DEPTH = 8
_MAX_CONFIG_BYTES = 1024 * 1024


def corral_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".corral")


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) for Corral's own files: mode 700 whatever the umask, and
    an existing directory made private too. Everything under Corral's home is the user's alone."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def private_home() -> Path:
    """Corral's home, created private (mode 700)."""
    return private_dir(corral_home())


def _parent_of_private(path: Path) -> None:
    """A private file's folder: created mode 700 if missing; an existing one is left as it is (a file
    Corral is pointed at in a shared folder, such as a SQLite store in /tmp, must not lock others out)."""
    if not path.parent.is_dir():
        private_dir(path.parent)


def private_file(path: Path) -> Path:
    """Make sure `path` exists and is mode 600 (created so, never briefly readable by others)."""
    _parent_of_private(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)
    return path


def write_private(path: Path, text: str) -> Path:
    """Replace `path` with `text` atomically, mode 600 (its folder 700 when Corral creates it)."""
    _parent_of_private(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def env_number(name: str, default: float, *, unit: str = "seconds", minimum: float = 0.0, note: str = "") -> float:
    """The number in the environment variable `name`, `default` when it is unset or empty; ConfigError
    naming the variable for anything else (not a number, not finite, under `minimum`)."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= minimum):
        at_least = f", at least {_plain(minimum)}" if minimum else ""
        raise ConfigError(f"{name}={raw!r} is not a number of {unit}{at_least} ({_plain(default)} by default{note})")
    return value


def _plain(number: float) -> str:
    return f"{int(number):,}" if number == int(number) else f"{number:g}"


def default_timeout() -> float:
    """`CORRAL_TIMEOUT` seconds (default 10): the bound on every wait for a login node's answer."""
    return check_timeout(env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT), TIMEOUT_ENV)


def check_timeout(value: float, what: str = "--timeout") -> float:
    if not (math.isfinite(value) and 1 <= value <= 3600):
        raise ConfigError(f"{what} {value!r}: give between 1 and 3600 seconds")
    return value


def cluster_file_path() -> Path:
    return Path(os.environ.get(CLUSTER_FILE_ENV) or Path.home() / ".slurm" / "config")


SLURM, MACHINE, POOL, KUBE = "slurm", "machine", "pool", "k8s"
# The Infra kind of each kind of registry entry (a pool's machines are not places of their own).
INFRA_KINDS = {SLURM: "slurm", POOL: "ssh", KUBE: "k8s"}
# What to set up for a kind of place asked for (`--infra k8s`) when there is none of it.
NOT_SET_UP = {"slurm": "no Slurm cluster is set up: add a Host to the cluster file (~/.slurm/config)",
              "ssh": "no SSH pool is set up: add one under `pools:` in config.yaml (docs/pools.md)",
              "k8s": "no Kubernetes context is set up: list contexts under `kubernetes: {allowed_contexts: […]}` in "
                     "config.yaml (docs/kubernetes.md)"}


@dataclass(frozen=True)
class ClusterEntry:
    """One ssh destination (a Slurm cluster's login node, or a pool's machine), or one pool."""

    name: str
    path: Path
    line: int
    hostname: str | None  # the HostName given in its own block, if any
    kind: str = SLURM  # SLURM, MACHINE (a pool's), POOL, KUBE

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class PoolEntry:
    """An SSH pool: its machines, and the GPUs of those the config describes (`TYPE:N`)."""

    name: str
    hosts: tuple[str, ...]
    gpus: tuple[tuple[str, str], ...] = ()  # (host, "A100:4") where nvidia-smi is missing


@dataclass(frozen=True)
class KubeEntry:
    """A Kubernetes context of a kubeconfig, and the namespace Corral's jobs go in (None: the context's)."""

    name: str
    kubeconfig: str | None = None  # None: $KUBECONFIG, else ~/.kube/config (as kubectl)
    namespace: str | None = None


@dataclass(frozen=True)
class ClusterRegistry:
    path: Path
    entries: tuple[ClusterEntry, ...]
    pools: tuple[PoolEntry, ...] = ()
    kube: tuple[KubeEntry, ...] = ()

    def names(self) -> list[str]:
        """The places work can go: the Slurm clusters, in file order, then the pools, then the contexts."""
        return ([e.name for e in self.entries if e.kind == SLURM] + [p.name for p in self.pools]
                + [k.name for k in self.kube])

    def infra_kind(self, name: str) -> str:
        """The place's Infra kind: slurm, ssh (a pool) or k8s (a context)."""
        return INFRA_KINDS[self.kind(name)]

    def names_of(self, *kinds: str) -> list[str]:
        """The places of these Infra kinds (`--infra k8s`), in the order of names()."""
        return [name for name in self.names() if self.infra_kind(name) in kinds]

    def kube_context(self, name: str) -> KubeEntry:
        for context in self.kube:
            if context.name == name:
                return context
        raise UnknownClusterError(name, self.names())

    def hosts(self) -> list[str]:
        """Every ssh destination: the clusters' login nodes and the pools' machines."""
        return [e.name for e in self.entries]

    def kind(self, name: str) -> str:
        return self.get(name).kind

    def pool(self, name: str) -> PoolEntry:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise UnknownClusterError(name, self.names())

    def get(self, name: str) -> ClusterEntry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        for pool in self.pools:
            if pool.name == name:
                return ClusterEntry(pool.name, self.path, 0, None, POOL)
        for context in self.kube:
            if context.name == name:
                return ClusterEntry(context.name, settings_path(), 0, None, KUBE)
        raise UnknownClusterError(name, self.names())

    def select(self, names: list[str] | tuple[str, ...] | None) -> list[ClusterEntry]:
        """The named places, in the order given (default: all; clusters in file order, pools, contexts)."""
        return [self.get(n) for n in (dict.fromkeys(names) if names else self.names())]


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?!")


def _parse(path: Path, entries: list[ClusterEntry], depth: int) -> None:
    try:
        if path.stat().st_size > _MAX_CONFIG_BYTES:
            raise ConfigError(f"cluster file is larger than {_MAX_CONFIG_BYTES // 1024} KiB", path)
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError("cluster file not found", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read cluster file: {exc}", path) from None
    current: list[int] = []  # indexes into entries of the Host block being read
    for lineno, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _KEYWORD.match(raw)
        if not match or not match.group(2):
            raise ConfigError(
                f"malformed line {stripped!r}: expected `Keyword value` (OpenSSH config syntax)",
                path, lineno,
            )
        keyword, value = match.group(1).lower(), match.group(2)
        if keyword == "host":
            current = []
            for name in value.split():
                if _is_pattern(name):
                    continue
                if not _CLUSTER_NAME.match(name):
                    raise ConfigError(
                        f"cluster name {name!r} cannot be used: a cluster's Host name may hold letters, digits "
                        "and '_', '.', '-', '@', '+', and may not start with '-'", path, lineno)
                if any(e.name == name for e in entries):
                    continue  # as in OpenSSH, the first block for a name defines it
                current.append(len(entries))
                entries.append(ClusterEntry(name=name, path=path, line=lineno, hostname=None))
        elif keyword == "match":
            current = []
        elif keyword == "hostname":
            for i in current:
                e = entries[i]
                entries[i] = ClusterEntry(e.name, e.path, e.line, value.split()[0])
        elif keyword == "include":
            if depth >= _MAX_INCLUDE_DEPTH:
                raise ConfigError("Include nested too deeply", path, lineno)
            for pattern in value.split():
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = str(Path.home() / ".ssh" / pattern)
                for included in sorted(glob.glob(pattern)):
                    _parse(Path(included), entries, depth + 1)


def load_registry(path: Path | None = None) -> ClusterRegistry:
    """Read the cluster file. Raises ConfigError naming the file (and line) on bad input."""
    path = path or cluster_file_path()
    if not path.exists():
        raise ConfigError(
            "cluster file not found: create it with one `Host <cluster>` entry per login node "
            f"(OpenSSH syntax), or point {CLUSTER_FILE_ENV} at one",
            path,
        )
    entries: list[ClusterEntry] = []
    _parse(path, entries, 0)
    settings = load_user_settings()
    pools = _pools(settings.get("pools") or {})
    for pool in pools:
        for host in pool.hosts:
            index = next((i for i, e in enumerate(entries) if e.name == host), None)
            if index is None:  # a plain host name: reached with the file's `Host *` options
                entries.append(ClusterEntry(host, path, 0, None, MACHINE))
            elif entries[index].kind == MACHINE:
                raise ConfigError(f"pools.{pool.name}: {host} is in another pool too; a machine is in one pool",
                                  settings_path())
            else:
                entries[index] = ClusterEntry(host, entries[index].path, entries[index].line, entries[index].hostname,
                                              MACHINE)
        if any(e.name == pool.name for e in entries):
            raise ConfigError(f"pools.{pool.name}: a cluster or machine of {path} has that name; name the pool "
                              "differently", settings_path())
    entries = _allowed(entries, settings, path)
    kube = _kube_contexts(settings.get("kubernetes") or {})
    for context in kube:
        if any(e.name == context.name for e in entries) or any(p.name == context.name for p in pools):
            raise ConfigError(f"kubernetes.allowed_contexts: {context.name} is also the name of a cluster, machine "
                              "or pool; a place has one name", settings_path())
    if not entries:
        raise ConfigError("no clusters defined: add a `Host <cluster>` entry per login node", path)
    return ClusterRegistry(path=path, entries=tuple(entries), pools=tuple(pools), kube=tuple(kube))


def _allowed(entries: list[ClusterEntry], settings: dict[str, object], path: Path) -> list[ClusterEntry]:
    """The file's hosts but the clusters `slurm.allowed_clusters` leaves out (when set): ssh still
    reaches them (a bastion named by ProxyJump), but no work goes there and no command asks them. A
    pool's machines are the pool's either way."""
    slurm = settings.get("slurm")
    if not isinstance(slurm, dict):
        return entries
    allowed = list(slurm["allowed_clusters"])
    hosts = [e.name for e in entries]
    if unknown := [name for name in allowed if name not in hosts]:
        raise ConfigError(f"slurm.allowed_clusters: {unknown[0]!r} is no Host of {path} (its hosts: "
                          f"{', '.join(hosts) or 'none'})", settings_path())
    return [e for e in entries if e.kind != SLURM or e.name in allowed]


def _kube_contexts(raw: object) -> list[KubeEntry]:
    """`kubernetes:` of config.yaml (checked by load_user_settings) as entries."""
    assert isinstance(raw, dict)
    kubeconfig = raw.get("kubeconfig")
    return [KubeEntry(str(name), str(kubeconfig) if kubeconfig else None,
                      str(raw["namespace"]) if raw.get("namespace") else None)
            for name in raw.get("allowed_contexts") or []]


def _pools(raw: object) -> list[PoolEntry]:
    """`pools:` of config.yaml (checked by load_user_settings) as entries."""
    assert isinstance(raw, dict)
    return [PoolEntry(str(name), tuple(str(h) for h in spec["hosts"]),
                      tuple((str(h), str(g)) for h, g in (spec.get("gpus") or {}).items()))
            for name, spec in raw.items()]


USER_SETTINGS_KEYS = ("idle_minutes", "submit_as", "clusters", "pools", "kubernetes", "slurm", "infra_order",
                      "rpc_budget", "run_dirs", "workdir_cache")
INFRA_ORDER_KINDS = ("slurm", "ssh", "k8s")


def load_user_settings() -> dict[str, object]:
    """`~/.corral/config.yaml` (under CORRAL_HOME): defaults such as `idle_minutes: 60`, a team
    server's `submit_as`, and per cluster `clusters: {NAME: {submit_as: …, account: …, …}}`
    (accounts.py, profiles.py)."""
    path = settings_path()
    if not path.exists():
        return {}
    import yaml

    try:
        if path.stat().st_size > _MAX_CONFIG_BYTES:
            raise ConfigError(f"larger than {_MAX_CONFIG_BYTES // 1024} KiB", path)
        text = path.read_text()
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {' '.join(str(exc).split())}", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", path) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping of settings, e.g. `idle_minutes: 60`", path)
    from corral.taskfile import repeated_keys

    if repeated := repeated_keys(text):  # YAML would keep the later one: a pool or a cluster's settings lost
        raise ConfigError(f"{repeated[0]}: written twice in one mapping; merge the two", path)
    for key, value in data.items():
        if key not in USER_SETTINGS_KEYS:
            raise ConfigError(f"unknown setting {key!r}; known: {', '.join(USER_SETTINGS_KEYS)}", path)
        if key == "idle_minutes" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise ConfigError(f"setting {key!r} must be a number", path)
        if key == "submit_as" and not isinstance(value, str):
            raise ConfigError("setting 'submit_as' must be one of ssh, sudo, service", path)
        if key == "clusters":
            _check_cluster_settings(value, path)
        if key == "pools":
            _check_pool_settings(value, path)
        if key == "kubernetes":
            _check_kube_settings(value, path)
        if key == "slurm":
            _check_slurm_settings(value, path)
        if key == "rpc_budget":
            check_rpc_budget(value, "rpc_budget", path)
        if key == "run_dirs" and not _one_number(value, "keep_days", 0, 36500, integer=False):
            raise ConfigError("setting 'run_dirs': expected `{keep_days: N}`, N days from 0 to 36500 that a job's run "
                              "directory (its log and workdir copy) stays on the cluster after it ended", path)
        if key == "workdir_cache" and not _one_number(value, "keep_days", 1, 36500, integer=False):
            raise ConfigError("setting 'workdir_cache': expected `{keep_days: N}`, N days from 1 to 36500 that a "
                              "cluster's copy of a workdir stays after its last launch", path)
        if key == "infra_order" and (not isinstance(value, list) or not value
                                     or any(v not in INFRA_ORDER_KINDS for v in value) or len(set(value)) != len(value)):
            raise ConfigError("setting 'infra_order' must list kinds of place, each once, most preferred first, e.g. "
                              f"`infra_order: [slurm, k8s, ssh]` (kinds: {', '.join(INFRA_ORDER_KINDS)})", path)
    return data


def check_rpc_budget(value: object, where: str, path: Path | None = None) -> None:
    """`rpc_budget: {commands_per_minute: N}`: the most Slurm commands a minute Corral sends a cluster."""
    if not _one_number(value, "commands_per_minute", 1, 1_000_000, integer=True):
        raise ConfigError(f"{where}: expected `{{commands_per_minute: N}}`, N from 1 to 1000000 (the most Slurm "
                          "commands a minute Corral sends a cluster's controller)", path)


def _one_number(value: object, key: str, low: float, high: float, *, integer: bool) -> bool:
    """Is `value` the mapping `{key: N}`, N a number (an integer, if so asked; never a boolean) from
    `low` to `high`?"""
    if not isinstance(value, dict) or set(value) != {key}:
        return False
    number = value[key]
    return (isinstance(number, int if integer else int | float) and not isinstance(number, bool)
            and low <= number <= high)


def infra_order() -> tuple[str, ...]:
    """`infra_order:` of config.yaml: among places that can start a task equally soon, which kind first
    (kinds it leaves out follow, in the default order slurm, ssh, k8s)."""
    value = load_user_settings().get("infra_order") or INFRA_ORDER_KINDS
    assert isinstance(value, list | tuple)
    return tuple(dict.fromkeys([*map(str, value), *INFRA_ORDER_KINDS]))


_KUBE_KEYS = ("allowed_contexts", "namespace", "kubeconfig")


def _check_slurm_settings(value: object, path: Path) -> None:
    """`slurm: {allowed_clusters: [a, b]}`: the Host entries that are Slurm clusters (SkyPilot's
    setting of that name); the file's other hosts (a bastion for ProxyJump) are no cluster."""
    example = "`slurm: {allowed_clusters: [alpine, borealis]}`"
    if not isinstance(value, dict) or set(value) - {"allowed_clusters"}:
        raise ConfigError(f"setting 'slurm' takes allowed_clusters only, e.g. {example}", path)
    _check_place_names(value.get("allowed_clusters"), "slurm.allowed_clusters", "the cluster file's Host names",
                       example, "rename the Host in the cluster file", path)


def _check_place_names(names: object, setting: str, what: str, example: str, rename: str, path: Path) -> None:
    """A setting that lists places by name (`allowed_clusters`, `allowed_contexts`): a list, not empty,
    of names a place can have, each once."""
    if not isinstance(names, list) or not names:
        raise ConfigError(f"{setting}: expected a list of {what}, e.g. {example}", path)
    for name in names:
        if not isinstance(name, str) or not _CLUSTER_NAME.match(name):
            raise ConfigError(f"{setting}: {name!r} cannot be a place's name (letters, digits, '_', '.', '-', '@', "
                              f"'+'); {rename}", path)
    if twice := sorted({name for name in names if names.count(name) > 1}):
        raise ConfigError(f"{setting}: {', '.join(twice)} listed twice", path)


# A namespace is a DNS label (RFC 1123).
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?\Z", re.ASCII)


def _check_kube_settings(value: object, path: Path) -> None:
    example = "`kubernetes: {allowed_contexts: [my-context], namespace: default}`"
    if not isinstance(value, dict):
        raise ConfigError(f"setting 'kubernetes' must be a mapping, e.g. {example}", path)
    for key in value:
        if key not in _KUBE_KEYS:
            raise ConfigError(f"kubernetes: unknown setting {key!r}; known: {', '.join(_KUBE_KEYS)}", path)
    _check_place_names(value.get("allowed_contexts"), "kubernetes.allowed_contexts", "kubeconfig contexts", example,
                       "rename the context in the kubeconfig", path)
    namespace = value.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not _DNS_LABEL.match(namespace)):
        raise ConfigError(f"kubernetes.namespace: {namespace!r} is not a namespace name (lowercase letters, digits "
                          "and '-', at most 63)", path)
    kubeconfig = value.get("kubeconfig")
    if kubeconfig is not None and not isinstance(kubeconfig, str):
        raise ConfigError("kubernetes.kubeconfig: expected the path of a kubeconfig file", path)


_POOL_KEYS = ("hosts", "gpus")
_GPU_COUNT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\- ]{0,63}:[1-9][0-9]{0,2}\Z", re.ASCII)


def _check_pool_settings(value: object, path: Path) -> None:
    if not isinstance(value, dict):
        raise ConfigError("setting 'pools' must map pool names to their machines, e.g. "
                          "`pools: {lab: {hosts: [gpu1, gpu2]}}`", path)
    for name, spec in value.items():
        if not isinstance(name, str) or not _CLUSTER_NAME.match(name):
            raise ConfigError(f"pools: {name!r} cannot be a pool's name (letters, digits, '_', '.', '-', '@', '+')",
                              path)
        if not isinstance(spec, dict) or not isinstance(spec.get("hosts"), list) or not spec["hosts"]:
            raise ConfigError(f"pools.{name}: expected `hosts: [HOST, …]` (ssh destinations)", path)
        for key in spec:
            if key not in _POOL_KEYS:
                raise ConfigError(f"pools.{name}: unknown setting {key!r}; known: {', '.join(_POOL_KEYS)}", path)
        for host in spec["hosts"]:
            if not isinstance(host, str) or not _CLUSTER_NAME.match(host):
                raise ConfigError(f"pools.{name}.hosts: {host!r} is not a host name (letters, digits, '_', '.', "
                                  "'-', '@', '+')", path)
        if len(set(spec["hosts"])) != len(spec["hosts"]):
            raise ConfigError(f"pools.{name}.hosts: a host is listed twice", path)
        gpus = spec.get("gpus") or {}
        if not isinstance(gpus, dict):
            raise ConfigError(f"pools.{name}.gpus: expected `HOST: TYPE:COUNT`, e.g. `gpu2: A10G:1`", path)
        for host, gpu in gpus.items():
            if host not in spec["hosts"]:
                raise ConfigError(f"pools.{name}.gpus: {host!r} is not one of the pool's hosts", path)
            if not isinstance(gpu, str) or not _GPU_COUNT.match(gpu):
                raise ConfigError(f"pools.{name}.gpus.{host}: {gpu!r}: expected TYPE:COUNT, e.g. A10G:1", path)


def settings_path() -> Path:
    return corral_home() / "config.yaml"


# `submit_as` (accounts.py), then a cluster's profile (profiles.py validates those).
_CLUSTER_SETTINGS = ("submit_as", "account", "qos", "constraint", "reservation", "time", "sbatch_args", "env",
                     "setup_prefix", "paths", "avoid_partitions", "partitions", "rpc_budget")


def _check_cluster_settings(value: object, path: Path) -> None:
    if not isinstance(value, dict):
        raise ConfigError("setting 'clusters' must map cluster names to their settings, e.g. "
                          "`clusters: {alpine: {submit_as: sudo}}`", path)
    for name, options in value.items():
        if not isinstance(options, dict):
            raise ConfigError(f"clusters.{name}: expected a mapping of settings, e.g. `submit_as: sudo`", path)
        for key in options:
            if key not in _CLUSTER_SETTINGS:
                raise ConfigError(f"clusters.{name}: unknown setting {key!r}; known: {', '.join(_CLUSTER_SETTINGS)}",
                                  path)
        if "rpc_budget" in options:
            check_rpc_budget(options["rpc_budget"], f"clusters.{name}.rpc_budget", path)
