"""The per-folder workdir caches on a Slurm login node or an SSH pool's machine (`~/.corral/cache/<key>/`):
where they are, the marker of their last use, and the script that prunes those not used for a while.

A launch rsyncs its workdir into the cache of its folder (only the changes travel), then hard-links
the cache into the attempt's run directory (SlurmInfra.upload_workdir; on a pool, the submission's
own script, sshpool/runner.py). Each sync first touches
`<key>.used` beside the cache and holds a shared lock on it while it writes (ssh.held_by). A cache
is only a speed-up: removing one costs a full upload on the next launch from its folder.

The prune takes each old marker's lock exclusively without waiting: one that a sync holds is passed
over, and a sync that starts meanwhile waits for the rename (an instant), then fills a fresh folder.
Old folders are renamed away under the lock and deleted after it, so a sync never waits for a large
`rm -rf`. Caches from before markers get one, and so their N days start at the first prune. Where
the site has no flock, the prune goes by the markers' age alone.

Cost: the hold adds about 4 ms to a sync (bash starts rsync and flock); the prune is one round trip,
no Slurm command, per cluster and user (run_files.py, once a day): 1.4 s for 1,000 caches, half of
them old, on the testbed (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING

from corral.infra.shell import checked

if TYPE_CHECKING:
    from corral.ssh import SshTransport

CACHE_DIR = ".corral/cache"  # under the user's home on the login node
KEEP_DAYS = 14.0  # `workdir_cache: {keep_days: N}` in config.yaml; a cache lasts this long after its last use
_KEY = re.compile(r"^[0-9a-f]{16}\Z")  # uploads.cache_key's shape


# Per (event loop, place, cache key): the engine is the one process that syncs workdirs, so a lock here
# is enough (an asyncio.Lock belongs to one loop; tests run several).
_LOCKS: dict[tuple[int, str, str], asyncio.Lock] = {}


def cache_lock(place: str, key: str) -> asyncio.Lock:
    """One sync at a time into a cache: another launch from the same folder must not change it between
    this one's sync and its copy into the run directory."""
    return _LOCKS.setdefault((id(asyncio.get_running_loop()), place, key), asyncio.Lock())


def cache_path(key: str) -> str:
    return f"{CACHE_DIR}/{_checked(key)}"


def marker_path(key: str) -> str:
    """The file a sync into the cache touches first, and holds a shared lock on while it writes."""
    return f"{CACHE_DIR}/{_checked(key)}.used"


async def sync_into(transport: SshTransport, place: str, local: Path, key: str) -> None:
    """Mirror the workdir `local` into the cache `key` on `place` (a login node, a pool's machine),
    marking its use and holding its lock while rsync writes."""
    await transport.sync(place, local, cache_path(key) + "/", mirror=True, hold=marker_path(key))


async def lacks(transport: SshTransport, place: str, local: Path, key: str) -> int | None:
    """The bytes `sync_into` would send now (rsync's dry run); None where rsync cannot tell."""
    return await transport.sync_size(place, local, cache_path(key) + "/")


def _checked(key: str) -> str:
    return checked(_KEY, key, "a workdir cache's key")


def prune_script(keep_days: float) -> str:
    """Bash: remove the caches whose marker is older than `keep_days` days by the login node's clock
    and whose lock is free; print `pruned N`."""
    keep = max(1, int(keep_days * 86400))
    return f"""umask 077 && cd "$HOME"/{CACHE_DIR} 2>/dev/null || {{ echo 'pruned 0'; exit 0; }}
ref=$(mktemp ./.prune.XXXXXX) || exit 1
touch -d "@$(( $(date +%s) - {keep} ))" "$ref" || {{ rm -f "$ref"; exit 1; }}
have_flock=$(command -v flock)
n=0 gone=()
for d in */; do
  k=${{d%/}}
  [[ $k =~ ^[0-9a-f]{{16}}$ ]] || continue
  m=$k.used
  if [ ! -e "$m" ]; then [ -d "$k" ] && : > "$m"; continue; fi
  [ "$m" -ot "$ref" ] || continue
  exec 9<"$m" || continue
  if {{ [ -z "$have_flock" ] || flock -n -x 9; }} && [ "$m" -ot "$ref" ] && mv -- "$k" ".gone.$k.$$"; then
    gone+=("$m"); n=$((n+1))
  fi
  exec 9<&-
done
[ "${{#gone[@]}}" -eq 0 ] || rm -f -- "${{gone[@]}}"
for m in *.used; do
  k=${{m%.used}}
  [[ $k =~ ^[0-9a-f]{{16}}$ ]] && [ ! -e "$k" ] && [ "$m" -ot "$ref" ] && rm -f -- "$m"
done
rm -rf -- "$ref" .gone.* 2>/dev/null
echo "pruned $n"
"""


def read_pruned(stdout: str) -> int:
    """How many caches the prune script removed (0 if it did not say)."""
    found = re.search(r"^pruned (\d+)$", stdout, re.MULTILINE)
    return int(found.group(1)) if found else 0
