"""What one SSH machine has, in one round trip: its name, CPUs, memory, GPUs (`nvidia-smi --query-gpu`
where the driver's tools exist, else what the pool's config says), and which GPUs Corral's tasks there
hold now. Pure apart from the script it writes: parsed from recorded output in the tests.

Corral keeps a machine's bookkeeping under `~/.corral/pool/<hostname>/` (per host: homes are often one
NFS share across a lab's machines): `held/<gpu index>` names the task holding that GPU, and the
holder's process id and start time (so that a reused process id is not taken for the holder): a GPU
whose task has died is free again without anyone cleaning up.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.errors import ProbeParseError
from corral.infra.shell import WRAPPED_RUNTIMES

MARK = "@@corral"
NVIDIA_SMI_TIMEOUT = 10  # seconds; a wedged driver makes nvidia-smi hang
QUERY = "index,name,memory.total,uuid"
POOL_DIR = ".corral/pool"  # under the home; then <hostname>/
RUNS_DIR = ".corral/runs"  # under the home; then <token>/
HOME_ID = ".corral/home-id"  # under the home: random, made once, so machines that share a home are told apart
# Bash: `alive PID START` is true while that very process runs (START: its start time, field 22 of
# /proc/PID/stat, read after the command name, which may hold spaces); `started PID` prints it, and
# fails for a zombie (a task whose parent is gone waits there until init reaps it: it is over).
ALIVE = ("started() { local s; read -r s 2>/dev/null </proc/\"$1\"/stat || return 1; s=${s##*) }; "
         "set -- $s; [ \"$1\" != Z ] && echo \"${20}\"; }\n"
         "alive() { [ -n \"${1:-}\" ] && [ \"$(started \"$1\")\" = \"${2:-}\" ] && [ -n \"${2:-}\" ]; }\n")


def inventory_script() -> str:
    """Bash printing `@@corral <section> <status>` sections: host, cpus, memory, gpus, held, claims (the
    CPUs and memory MB Corral's tasks hold), queued (each waiting task's `<memory MB> <gpus> <cpus>
    <type>`), address, home (the home's id, HOME_ID, made by the first probe: machines with the same
    one share a home), runtimes (the container runtimes on its PATH)."""
    return f"""\
export LC_ALL=C
printf '\\n{MARK} host 0\\n'; hostname
printf '\\n{MARK} cpus 0\\n'; nproc
printf '\\n{MARK} memory 0\\n'; awk '$1 == "MemTotal:" || $1 == "MemAvailable:" {{print $2}}' /proc/meminfo
if command -v nvidia-smi >/dev/null 2>&1; then
  out=$(timeout {NVIDIA_SMI_TIMEOUT} nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits 2>&1); rc=$?
  printf '\\n{MARK} gpus %s\\n%s\\n' "$rc" "$out"
else
  printf '\\n{MARK} gpus 127\\n'
fi
printf '\\n{MARK} held 0\\n'
{ALIVE}base="$HOME/{POOL_DIR}/$(hostname)"
for f in "$base/held/"*; do
  [ -f "$f" ] || continue
  read -r token pid start < "$f" || true
  if alive "${{pid:-}}" "${{start:-}}"; then echo "${{f##*/}} $token"; fi
done
printf '\\n{MARK} claims 0\\n'
for kind in cpus mem; do
  used=0
  for f in "$base/$kind/"*; do
    [ -f "$f" ] || continue
    read -r n pid start < "$f" || continue
    if alive "$pid" "$start"; then used=$((used + n)); fi
  done
  printf '%s ' "$used"
done
echo
printf '\\n{MARK} queued 0\\n'
for f in "$base/queue/"*; do
  [ -e "$f" ] || continue
  q="$HOME/{RUNS_DIR}/${{f##*_}}"; m=0; [ -s "$q/memory" ] && read -r m < "$q/memory"
  read -r wants 2>/dev/null < "$q/wants" && echo "$m $wants"
done
printf '\\n{MARK} address 0\\n'; hostname -I 2>/dev/null | awk '{{print $1}}'
f="$HOME/{HOME_ID}"
if [ ! -s "$f" ]; then
  mkdir -p "${{f%/*}}" && od -An -N8 -tx1 /dev/urandom | tr -d ' \\n' > "$f.$$" && mv -n "$f.$$" "$f"; rm -f "$f.$$"
fi
printf '\\n{MARK} home 0\\n'; cat "$f" 2>/dev/null
printf '\\n{MARK} runtimes 0\\n'
for r in {" ".join(WRAPPED_RUNTIMES)}; do command -v "$r" >/dev/null 2>&1 && echo "$r"; done
printf '\\n{MARK} end 0\\n'
"""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str  # as nvidia-smi names it (`NVIDIA A100-SXM4-80GB`), or as the pool's config does
    memory_mib: int | None
    uuid: str | None


@dataclass(frozen=True)
class Inventory:
    host: str  # what the machine calls itself
    cpus: int
    memory_mb: int
    memory_available_mb: int
    gpus: tuple[Gpu, ...]
    held: dict[int, str]  # GPU index -> the token of the live task holding it
    gpu_source: str  # "nvidia-smi", "config", or "none"
    warnings: tuple[str, ...] = ()
    address: str | None = None  # its first address (`hostname -I`): how a multi-node task's ranks reach it
    cpus_claimed: int = 0  # by Corral's live tasks there
    memory_claimed_mb: int = 0  # by Corral's live tasks there
    queued: tuple[Wants, ...] = ()  # the tasks waiting in its queue, oldest first
    home: str | None = None  # its home's id (HOME_ID): the same on machines that share a home
    runtimes: tuple[str, ...] = ()  # those of shell.WRAPPED_RUNTIMES on its PATH: what can run an image there

    @property
    def free_gpus(self) -> list[Gpu]:
        return [g for g in self.gpus if g.index not in self.held]


@dataclass(frozen=True)
class Wants:
    """What a task takes on a machine (`runs/<token>/wants`, `memory`): GPUs of a type ('' any), CPUs
    and memory (MB; 0: none claimed)."""

    gpus: int
    cpus: int
    gpu_type: str
    memory_mb: int = 0


def _sections(machine: str, stdout: str) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    name, status, lines = None, 0, []
    for line in stdout.splitlines():
        if line.startswith(MARK + " "):
            if name is not None:
                out[name] = (status, "\n".join(lines).strip("\n"))
            parts = line.split()
            if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
                raise ProbeParseError(machine, f"unreadable section line {line!r}")
            name, status, lines = parts[1], int(parts[2]), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        out[name] = (status, "\n".join(lines).strip("\n"))
    if "end" not in out:
        raise ProbeParseError(machine, "the inventory's answer is incomplete")
    return out


def parse_inventory(machine: str, stdout: str, configured: tuple[Gpu, ...] = ()) -> Inventory:
    """The machine's inventory; `configured`: its GPUs per the pool's config, used where it has no
    nvidia-smi (and named in a warning where nvidia-smi fails)."""
    sections = _sections(machine, stdout)
    try:
        cpus = int(sections["cpus"][1].split()[0])
        memory = [int(v) for v in sections["memory"][1].split()]
    except (KeyError, IndexError, ValueError):
        raise ProbeParseError(machine, "no CPU or memory figures in the inventory") from None
    warnings: list[str] = []
    status, text = sections.get("gpus", (127, ""))
    if status == 0:
        gpus, bad = _nvidia_smi(text)
        warnings += [f"{machine}: unreadable nvidia-smi line {line!r}" for line in bad]
        source = "nvidia-smi"
    elif status == 127:
        gpus, source = configured, "config" if configured else "none"
    else:
        why = "timed out" if status == 124 else f"failed ({status}): {' '.join(text.split())[:200]}"
        warnings.append(f"{machine}: nvidia-smi {why}; " + ("using the pool's config for its GPUs" if configured
                                                            else "counted as having no GPUs"))
        gpus, source = configured, "config" if configured else "none"
    held: dict[int, str] = {}
    for line in sections.get("held", (0, ""))[1].splitlines():
        index, _, token = line.partition(" ")
        if index.isdigit() and token:
            held[int(index)] = token
    claimed = [int(n) for n in sections.get("claims", (0, "0"))[1].split() if n.isdigit()] + [0, 0]
    queued = []
    for line in sections.get("queued", (0, ""))[1].splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and all(p.isdigit() for p in parts[:3]):
            queued.append(Wants(int(parts[1]), int(parts[2]), parts[3] if len(parts) > 3 else "", int(parts[0])))
    return Inventory(host=sections.get("host", (0, machine))[1].strip() or machine, cpus=cpus,
                     memory_mb=memory[0] // 1024, memory_available_mb=(memory[1] if len(memory) > 1 else memory[0]) // 1024,
                     gpus=tuple(gpus), held=held, gpu_source=source, warnings=tuple(warnings),
                     address=sections.get("address", (0, ""))[1].strip() or None,
                     cpus_claimed=claimed[0], memory_claimed_mb=claimed[1], queued=tuple(queued),
                     home=sections.get("home", (0, ""))[1].strip() or None,
                     runtimes=tuple(r for r in sections.get("runtimes", (0, ""))[1].split()
                                    if r in WRAPPED_RUNTIMES))


def _nvidia_smi(text: str) -> tuple[list[Gpu], list[str]]:
    gpus, bad = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4 or not fields[0].isdigit():
            bad.append(line)
            continue
        memory = int(fields[2]) if fields[2].isdigit() else None
        gpus.append(Gpu(int(fields[0]), fields[1], memory, fields[3] or None))
    return gpus, bad
