"""The probe: one remote script, one SSH round trip, everything placement needs.

It also lists the container runtimes the login node offers (Pyxis when `srun --help` shows
`--container-image`; `apptainer`, `singularity` on its PATH). Everything runs at once: sinfo,
scontrol and squeue, each under `timeout`, the login node's facts (version, filesystems, runtimes),
and `scontrol ping`, which answers in milliseconds when the controller port refuses. If the ping
says the controller is not up, the queries are killed and the probe reports that at once, instead of
after Slurm's own ~10 s of retries. The outputs are printed as marked sections with their exit
statuses, by one `cat` (24 ms for the script on the testbed, against 42 ms when each step waited for
the one before), from a scratch folder in $TMPDIR, /tmp or the home folder (SCRATCH).

The login node's facts (`FACTS`: Slurm's version, the home's filesystem, the container runtimes)
are asked for only when the caller does not know them yet: the Slurm infra keeps them with the
login environment (ssh.SshTransport.login_notes), so a probe within its lifetime runs four
processes fewer (`srun --help` loads Slurm's plugins): its script's CPU on the testbed falls from
~32 to ~24 ms.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from corral.errors import ClusterError, ProbeParseError, SlurmControllerError
from corral.infra.base import ClusterSnapshot
from corral.infra.shell import WRAPPED_RUNTIMES, checked
from corral.task import SAFE_PATH, expandable
from corral.infra.slurm.parsing import (
    SINFO_FIELDS,
    SQUEUE_PENDING_FIELDS,
    controller_answered,
    format_spec,
    parse_partitions,
    parse_pending,
    parse_sinfo_nodes,
)

MARK = "@@corral"
TIMED_OUT = 124  # timeout(1)'s exit status

QUERIES = {
    "nodes": f"sinfo -h -N -O '{format_spec(SINFO_FIELDS)}'",
    "partitions": "scontrol show partition -o",
    "pending": f"squeue -h -t PENDING -O '{format_spec(SQUEUE_PENDING_FIELDS)}'",
}


# A scratch folder for the outputs of commands run at once: in $TMPDIR, else /tmp, else the home
# folder (a login node's /tmp is full often enough, and a probe that cannot write there would
# otherwise fail with no reason given). If none takes one, a `scratch` section says why, and `end`.
SCRATCH = f"""\
d=$(mktemp -d "${{TMPDIR:-/tmp}}/corral.XXXXXX" 2>/dev/null || mktemp -d /tmp/corral.XXXXXX 2>/dev/null \
  || mktemp -d "$HOME/.corral-scratch.XXXXXX" 2>&1) \
  || {{ printf '\\n{MARK} scratch 1\\n%s\\n\\n{MARK} end 0\\n' "$d"; exit 0; }}
trap 'rm -rf "$d"' EXIT
"""


def scratch_failure(sections: dict[str, Section]) -> str | None:
    """Why a script found no scratch folder on the login node (SCRATCH); None if it found one."""
    failed = sections.get("scratch")
    if failed is None or failed.status == 0:
        return None
    return (f"the login node has no room for a temporary folder in $TMPDIR, /tmp or the home folder "
            f"({_one_line(failed.text)}); free some space there")


# `corral check` only: the user's associations (account|qos per line), from slurmdbd where there is one.
ASSOCIATIONS = 'sacctmgr -nP show assoc where user="$(id -un)" format=account,qos'


# The login node's own facts, which change only when its admins change it: kept with its environment.
FACTS = ("version", "homefs", "runtimes")
_FACTS_LINES = f"""\
printf '\\n{MARK} version 0\\n'; sinfo --version 2>&1
printf '\\n{MARK} homefs 0\\n'; stat -f -c %T "$HOME" 2>/dev/null
printf '\\n{MARK} runtimes 0\\n'; srun --help 2>&1 | grep -q -e --container-image && echo pyxis
for r in {" ".join(WRAPPED_RUNTIMES)}; do command -v "$r" >/dev/null 2>&1 && echo "$r"; done
"""


def probe_script(slurm_timeout: int, *, associations: bool = False, paths: tuple[str, ...] = (),
                 filesystems: tuple[str, ...] = (), facts: bool = True) -> str:
    """The remote bash script. Built from constants, and from `paths` and `filesystems` that
    task.SAFE_PATH checked (only $USER/$HOME expand inside their double quotes; each is echoed back
    single-quoted). `filesystems`: the filesystem type of each (of its nearest existing folder).
    `facts`: also the login node's own facts (FACTS), for a caller that does not know them yet."""
    seconds = int(slurm_timeout)
    for path in (*paths, *filesystems):
        checked(SAFE_PATH, path, "a checked path")
    exists = "".join(f'[ -e "{expandable(p)}" ] && echo {shlex.quote(p)}\n' for p in paths)
    if filesystems:
        exists += f"printf '\\n{MARK} pathfs 0\\n'\n" + "".join(
            f'p="{expandable(p)}"; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; '
            f'echo {shlex.quote(p)}"|$(stat -f -c %T "$p" 2>/dev/null)"\n' for p in filesystems)
    queries = {**QUERIES, **({"assoc": ASSOCIATIONS} if associations else {})}
    started = "\n".join(f'timeout {seconds} {command} >"$d/{name}" 2>&1 & q_{name}=$!' for name, command in queries.items())
    pids = " ".join(f"$q_{name}" for name in queries)
    waited = "\n".join(f"wait $q_{name}; printf '\\n{MARK} {name} %s\\n' $? >\"$d/{name}.h\"" for name in queries)
    sections = " ".join(f'"$d/{name}.h" "$d/{name}"' for name in queries)
    return f"""\
export LC_ALL=C
{SCRATCH}{started}
{{
{_FACTS_LINES if facts else ""}printf '\\n{MARK} paths 0\\n'
{exists}}} >"$d/static" & static=$!
ping=$(timeout {seconds} scontrol ping 2>&1); rc=$?
printf '\\n{MARK} ping %s\\n%s\\n' "$rc" "$ping" >"$d/ping"
wait $static
case "$ping" in *" is UP"*) ;; *) kill {pids} 2>/dev/null; cat "$d/static" "$d/ping"; printf '\\n{MARK} end 0\\n'; exit 0 ;; esac
{waited}
cat "$d/static" "$d/ping" {sections}
printf '\\n{MARK} end 0\\n'
"""


@dataclass(frozen=True)
class Section:
    status: int
    text: str


def split_sections(stdout: str) -> dict[str, Section]:
    """Sections of the probe's output; anything a login profile printed before the first is ignored."""
    sections: dict[str, Section] = {}
    name: str | None = None
    status = 0
    lines: list[str] = []
    for line in stdout.split("\n"):
        if line.startswith(MARK + " "):
            if name is not None:
                sections[name] = Section(status, "\n".join(lines).strip("\n"))
            _, name, raw_status = (line.split() + ["", ""])[:3]
            status = int(raw_status) if raw_status.lstrip("-").isdigit() else -1
            lines = []
        elif name is not None:
            lines.append(line)
    if name is not None:
        sections[name] = Section(status, "\n".join(lines).strip("\n"))
    return sections


def parse_probe_output(cluster: str, stdout: str, slurm_timeout: int, seconds: float = 0.0) -> ClusterSnapshot:
    return read_probe(cluster, stdout, slurm_timeout, seconds)[0]


def read_probe(cluster: str, stdout: str, slurm_timeout: int, seconds: float = 0.0,
               known: dict[str, Section] | None = None) -> tuple[ClusterSnapshot, dict[str, Section]]:
    """The snapshot in a probe's output, and the login node's facts (FACTS) it printed, to keep for the
    probes after it; `known`: the facts kept from an earlier probe, for one run without them."""
    sections = split_sections(stdout)
    facts = {name: sections[name] for name in FACTS if name in sections}
    return _snapshot(cluster, {**(known or {}), **sections}, slurm_timeout, seconds), facts


def _snapshot(cluster: str, sections: dict[str, Section], slurm_timeout: int, seconds: float) -> ClusterSnapshot:
    got = f" (sections: {', '.join(sections) or 'none'})"  # what came, for whoever reads the error
    if (no_scratch := scratch_failure(sections)) is not None:
        raise ClusterError(cluster, no_scratch)
    if "end" not in sections:
        raise ProbeParseError(cluster, f"the probe's output ended early{got}; was the remote shell killed?")
    version_text = sections.get("version", Section(0, "")).text.strip()
    version = version_text.split()[-1] if version_text.startswith("slurm") else None
    ping = sections.get("ping")
    if ping is None:
        raise ProbeParseError(cluster, f"the probe's output has no controller check{got}")
    if not controller_answered(ping.text):
        if ping.status == TIMED_OUT:
            detail = f"Slurm controller did not answer `scontrol ping` within {slurm_timeout}s"
        elif version is None:
            detail = f"Slurm commands not found on the login node ({version_text or 'no output'})"
        else:
            detail = f"Slurm controller is down: {_one_line(ping.text) or 'no answer'}"
        raise SlurmControllerError(cluster, detail)
    for name in ("nodes", "partitions", "pending"):
        section = sections.get(name)
        if section is None:
            raise ProbeParseError(cluster, f"the probe's output has no {name} section{got}")
        if section.status == TIMED_OUT:
            raise SlurmControllerError(cluster, f"Slurm controller did not answer within {slurm_timeout}s ({name})")
        if section.status != 0:
            raise SlurmControllerError(cluster, f"{QUERIES[name].split()[0]} failed: {_one_line(section.text)}")
    nodes, node_warnings = parse_sinfo_nodes(sections["nodes"].text)
    pending, pending_warnings = parse_pending(sections["pending"].text)
    runtimes = sections.get("runtimes", Section(0, "")).text.split()
    # Unknown accounts are None, not a warning: `check` tells when a profile names one (profiles.py),
    # and says nothing on the many clusters without accounting when none is needed.
    accounts, qos, _ = parse_associations(sections.get("assoc"))
    home_fs = sections.get("homefs", Section(0, "")).text.strip() or None
    found = sections.get("paths")
    path_fs = dict(line.rsplit("|", 1) for line in sections.get("pathfs", Section(0, "")).text.splitlines()
                   if "|" in line)
    return ClusterSnapshot(
        cluster=cluster,
        slurm_version=version,
        container_runtimes=tuple(runtimes),
        nodes=tuple(nodes),
        partitions=tuple(parse_partitions(sections["partitions"].text)),
        pending=tuple(pending),
        probe_seconds=seconds,
        warnings=tuple(node_warnings + pending_warnings),
        accounts=accounts,
        qos=qos,
        home_filesystem=home_fs,
        existing_paths=frozenset(found.text.splitlines()) if found is not None else None,
        path_filesystems=path_fs,
    )


def parse_associations(section: Section | None) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None, list[str]]:
    """(accounts, QOS, warnings) from `sacctmgr -nP show assoc … format=account,qos`; None and a warning
    when the cluster keeps no accounting (sacctmgr says so, with exit status 0) or sacctmgr failed."""
    if section is None:
        return None, None, []
    lines = [line for line in section.text.splitlines() if line.strip()]
    if section.status != 0 or any("|" not in line for line in lines):
        why = _one_line(section.text) or f"exit status {section.status}"
        return None, None, [f"accounts and QOS unknown: sacctmgr: {why}"]
    accounts = {line.split("|")[0] for line in lines if line.split("|")[0]}
    qos = {q for line in lines for q in line.split("|")[1].split(",") if q}
    return tuple(sorted(accounts)), tuple(sorted(qos)), []


def _one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
