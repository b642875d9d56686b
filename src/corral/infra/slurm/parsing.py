"""Parsers for Slurm command output, tested on verbatim output recorded from real clusters.

Sites run different Slurm versions: parse defensively, keep unknown fields out of the way, and never
let one odd line hide the rest.
"""

from __future__ import annotations

from corral.infra.base import GpuPool, Node, Partition, PendingDemand

# sinfo -N -O fields, in this order; Reason last because it is free text.
SINFO_FIELDS = ("NodeList", "Partition", "StateLong", "Gres", "GresUsed", "CPUsState", "Memory",
                "AllocMem", "Features", "Reason")
SQUEUE_PENDING_FIELDS = ("JobID", "Partition", "NumNodes", "NumTasks", "tres-per-job",
                         "tres-per-node", "tres-per-task", "Reason")
FIELD_SEPARATOR = "|"

# Trailing state flags: * not responding, ~ powered off, # powering up, % powering down,
# ! pending power down, $ maintenance reservation, @ pending reboot, ^ rebooting, - planned.
_STATE_FLAGS = "*~#%!$@^-+"
_UNUSABLE_FLAGS = set("*%!$@^")
_USABLE_STATES = {"idle", "mixed", "allocated", "alloc", "mix", "completing", "comp", "planned"}


def format_spec(fields: tuple[str, ...]) -> str:
    """The `-O` argument that prints these fields unpadded, separated by FIELD_SEPARATOR."""
    return ",".join(f"{f}:0{FIELD_SEPARATOR}" if i < len(fields) - 1 else f"{f}:0"
                    for i, f in enumerate(fields))


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside parentheses: `gpu:a:1(IDX:0,2),gpu:b:0` has two items."""
    items, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return [i.strip() for i in items if i.strip()]


def _count(text: str) -> int | None:
    text = text.strip()
    multiplier = {"k": 1024, "m": 1024**2, "g": 1024**3}.get(text[-1:].lower(), 1)
    if multiplier != 1:
        text = text[:-1]
    return int(text) * multiplier if text.isdigit() else None


def parse_gres(text: str, name: str = "gpu") -> list[tuple[str | None, int]]:
    """(type, count) for each `name` GRES in a GRES or GRES-used string.

    Accepts `gpu:h100:8(S:0-1)`, `gpu:4`, `gpu:nvidia_l4:0(IDX:N/A)`, `gpu:a:1(IDX:0,2),gpu:b:2`,
    `(null)`, and skips other GRES (`shard`, `mps`).
    """
    text = text.strip()
    if not text or text in ("(null)", "N/A"):
        return []
    out: list[tuple[str | None, int]] = []
    for item in split_top_level(text):
        item = item.split("(", 1)[0]
        parts = item.split(":")
        if parts[0] != name:
            continue
        if len(parts) == 1:
            out.append((None, 1))
        elif len(parts) == 2:
            count = _count(parts[1])
            out.append((None, count) if count is not None else (parts[1], 1))
        else:
            gres_type = None if parts[1] in ("", "(null)") else parts[1]
            out.append((gres_type, _count(parts[2]) or 0))
    return out


def split_state(state: str) -> tuple[str, str]:
    """`down*` → (`down`, `*`); `mixed-` → (`mixed`, `-`); `drained` → (`drained`, ``)."""
    base = state.rstrip(_STATE_FLAGS)
    return base.lower(), state[len(base):]


def state_usable(state: str) -> bool:
    base, flags = split_state(state)
    # Compound states print as "idle+drain" in some versions: any drain/down/fail part wins.
    parts = set(base.replace("+", " ").split())
    return bool(parts) and parts <= _USABLE_STATES and not (set(flags) & _UNUSABLE_FLAGS)


def _merge_pools(total: list[tuple[str | None, int]], used: list[tuple[str | None, int]]) -> tuple[GpuPool, ...]:
    pools: dict[str | None, list[int]] = {}
    for gres_type, count in total:
        pools.setdefault(gres_type, [0, 0])[0] += count
    for gres_type, count in used:
        if gres_type in pools:
            pools[gres_type][1] += count
        elif None in pools and gres_type is not None:
            pools[None][1] += count
        elif gres_type is None and len(pools) == 1:
            # GresUsed of an untyped request on a typed node prints as `gpu:N`.
            pools[next(iter(pools))][1] += count
    return tuple(GpuPool(t, tot, min(used_, tot)) for t, (tot, used_) in pools.items() if tot > 0)


def parse_sinfo_nodes(text: str) -> tuple[list[Node], list[str]]:
    """Nodes from `sinfo -h -N -O <SINFO_FIELDS>` (one row per node and partition), and warnings."""
    rows: dict[str, Node] = {}
    warnings: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(FIELD_SEPARATOR, len(SINFO_FIELDS) - 1)
        if len(fields) != len(SINFO_FIELDS):
            warnings.append(f"unreadable sinfo line: {line!r}")
            continue
        name, partition, state, gres, gres_used, cpus, memory, alloc_mem, features, reason = (
            f.strip() for f in fields)
        partition = partition.rstrip("*")
        if name in rows:
            node = rows[name]
            if partition and partition not in node.partitions:
                rows[name] = Node(**{**node.__dict__, "partitions": (*node.partitions, partition)})
            continue
        try:
            alloc, _idle, _other, total = (int(x) for x in cpus.split("/"))
            memory_mb = int(memory or 0)
            alloc_mem_mb = int(alloc_mem or 0)
        except ValueError:
            warnings.append(f"unreadable sinfo line: {line!r}")
            continue
        rows[name] = Node(
            name=name,
            partitions=(partition,) if partition else (),
            state=state,
            usable=state_usable(state),
            cpus_total=total,
            cpus_alloc=alloc,
            memory_mb=memory_mb,
            memory_alloc_mb=alloc_mem_mb,
            gpus=_merge_pools(parse_gres(gres), parse_gres(gres_used)),
            reason=None if reason in ("none", "", "(null)") else reason,
            features=parse_features(features),
        )
    return list(rows.values()), warnings


def parse_features(text: str) -> tuple[str, ...]:
    """A node's available features, as sinfo's Features field lists them (`ib,hdr`; `(null)`: none)."""
    return () if text in ("", "(null)") else tuple(f for f in text.split(",") if f)


def parse_key_values(line: str) -> dict[str, str]:
    """`A=1 B=x,y C=(null)` → dict. Values never contain spaces in `scontrol -o` partition output."""
    out: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def _limit(value: str | None) -> int | None:
    if value is None or not value.isdigit():
        return None  # UNLIMITED, or absent
    return int(value)


def parse_partitions(text: str) -> list[Partition]:
    """Partitions from `scontrol show partition -o` (includes partitions with no nodes)."""
    out = []
    for line in text.splitlines():
        kv = parse_key_values(line)
        if "PartitionName" not in kv:
            continue
        out.append(
            Partition(
                name=kv["PartitionName"],
                default=kv.get("Default", "NO").upper() == "YES",
                state=kv.get("State", "UNKNOWN"),
                max_time=kv.get("MaxTime", "UNLIMITED"),
                max_nodes=_limit(kv.get("MaxNodes")),
                total_nodes=_limit(kv.get("TotalNodes")) or 0,
            )
        )
    return out


def _tres_gpus(text: str) -> list[tuple[str | None, int]]:
    """GPU counts in a TRES string: `gres:gpu:2`, `gres/gpu:h100=2`, `gres:gpu:h100:2,gres:shard:1`."""
    if not text or text in ("N/A", "(null)"):
        return []
    out = []
    for item in split_top_level(text):
        item = item.replace("gres/", "gres:").replace("=", ":")
        if item.startswith("gres:"):
            item = item[len("gres:"):]
        out += parse_gres(item)
    return out


def parse_pending(text: str) -> tuple[list[PendingDemand], list[str]]:
    """GPU demand of pending jobs from `squeue -h -t PENDING -O <SQUEUE_PENDING_FIELDS>`."""
    out: list[PendingDemand] = []
    warnings: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(FIELD_SEPARATOR, len(SQUEUE_PENDING_FIELDS) - 1)
        if len(fields) != len(SQUEUE_PENDING_FIELDS):
            warnings.append(f"unreadable squeue line: {line!r}")
            continue
        _job, partitions, num_nodes, num_tasks, per_job, per_node, per_task, _reason = (f.strip() for f in fields)
        nodes = int(num_nodes) if num_nodes.isdigit() else 1
        tasks = int(num_tasks) if num_tasks.isdigit() else 1
        by_type: dict[str | None, int] = {}
        for multiplier, tres in ((1, per_job), (nodes, per_node), (tasks, per_task)):
            for gres_type, count in _tres_gpus(tres):
                by_type[gres_type] = by_type.get(gres_type, 0) + count * multiplier
        parts = tuple(p for p in partitions.split(",") if p)
        out += [PendingDemand(parts, t, n) for t, n in by_type.items() if n > 0]
    return out, warnings


def controller_answered(ping_output: str) -> bool:
    """`scontrol ping` names each controller with `is UP` or `is DOWN`; one UP is enough."""
    return any(line.rstrip().endswith("is UP") for line in ping_output.splitlines())
