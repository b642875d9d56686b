"""A waiting task's move to another machine of its pool (pure: bash golden-free, run on the testbed and in
the tests with real bash in scratch homes).

A pool's queue is kept on each machine, so a task waits where it was queued. When another machine of
the pool can start it now, the pool moves it there, keeping its token and its place by age:
1. `withdraw_script` on the machine it waits on, under that machine's lock: if it still waits, it
   leaves the queue and its run dir gets `moving` (`<target> <queue entry> <epoch> <its home's id>`); what waited
   behind it may start.
2. Where the two machines do not share a home, its run dir is copied to the target (fetched through
   Corral, then sent as any upload is).
3. `take_script` on the target, under its lock: the run dir names the target (`host`), `moving` is
   removed, and the task joins the target's queue under its old entry (so it keeps its age) and starts
   if it fits.
4. `settle_script` on the first machine: once taken, its own copy goes (homes apart); if the target
   refused, or never answered, the task goes back into that machine's queue as it was.

A status pass sees a half-done move (`runner.status_script`: `moving`, or `moved` where a shared
home's run dir names another machine) and finishes or undoes it, so a crash at any step neither loses
the task nor runs it twice.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from corral.infra.shell import check_token
from corral.infra.sshpool import claims
from corral.infra.sshpool.inventory import HOME_ID, MARK, POOL_DIR, RUNS_DIR

MOVE_GRACE_SECONDS = 120  # a `moving` mark this old that no one is finishing is undone (the mover died)
_ENTRY = re.compile(r"^[0-9]+_[0-9]+_[0-9]+_([0-9a-f]{12})$")


def check_entry(entry: str, token: str) -> str:
    """A queue entry's name (`<time>_<gpus>_<cpus>_<token>`, claims.enqueue), checked to be the token's."""
    match = _ENTRY.match(entry)
    if match is None or match.group(1) != token:
        raise ValueError(f"not a queue entry of {token}: {entry!r}")
    return entry


def _header(token: str) -> str:
    """Sets host, base, d (the run dir) and home (this home's id, `-` if it has none), opens the lock
    (fd 9); `copy` is true where the run dir is a copy from another home (its `moving` mark names that
    home's id)."""
    return (f'set -u\numask 077\nhost=${{HOSTNAME:-$(hostname)}}\nbase="$HOME/{POOL_DIR}/$host"\n'
            f'd="$HOME"/{shlex.quote(RUNS_DIR + "/" + check_token(token))}\n'
            f'home=-; [ -s "$HOME/{HOME_ID}" ] && read -r home < "$HOME/{HOME_ID}"\n'
            'copy() { local from=-; [ -s "$d/moving" ] && read -r _ _ _ from < "$d/moving"; '
            '[ "${from:--}" != - ] && [ "$from" != "$home" ]; }\n'
            'mkdir -p "$base/held" "$base/cpus" "$base/mem" "$base/queue" || exit 1\n'
            'exec 9>"$base/lock"\n')


def withdraw_script(token: str, target: str) -> str:
    """Take the task out of this machine's queue for a move to `target`: answers `@@corral withdrawn
    <entry>` (its queue entry), or `@@corral stays <why>` (it started, ended, was cancelled, or the lock
    stayed busy). Then what waited behind it may start."""
    return _header(token) + f"""\
flock -w 20 9 || {{ echo "{MARK} stays the lock of $host is busy"; exit 0; }}
entry=
for e in "$base/queue/"*_{token}; do [ -e "$e" ] && entry=${{e##*/}}; done
if [ -z "$entry" ] || [ ! -e "$d/queued" ] || [ -s "$d/pid" ] || [ -e "$d/cancelled" ]; then
  echo "{MARK} stays it no longer waits on $host"; exit 0
fi
printf '%s %s %s %s\\n' {shlex.quote(target)} "$entry" "$(date +%s)" "$home" > "$d/moving.new" \\
  && mv "$d/moving.new" "$d/moving" || exit 1
rm -f -- "$base/queue/$entry" "$d/queued"
echo "{MARK} withdrawn $entry"
[ -f "$base/{claims.LIBRARY}" ] && . "$base/{claims.LIBRARY}" && drain
exit 0
"""


def take_script(token: str, entry: str, configured: Sequence[str] = ()) -> str:
    """Queue the moved task on this machine under its old entry (its age), and start it if it fits:
    answers `@@corral submitted <host>/<token> new|queued|existing`, or `@@corral refused <why>`."""
    entry = check_entry(entry, token)
    return _header(token) + f"""\
refuse() {{ copy && rm -rf -- "$d"; echo "{MARK} refused $1"; exit 0; }}  # a copy refused is not kept
flock -w 20 9 || refuse "the lock of $host is busy"
took=; read -r took 2>/dev/null < "$d/host"
if [ "$took" = "$host" ] && {{ [ -s "$d/pid" ] || [ -e "$d/queued" ]; }}; then
  echo "{MARK} submitted $host/{token} existing"; exit 0
fi
[ -f "$d/wants" ] && [ -f "$d/job.sh" ] || refuse "its files are not on $host"
[ -e "$d/cancelled" ] && refuse "it was cancelled"
[ -s "$d/moving" ] || refuse "it is not being moved"
{claims.install(configured)}printf '%s\\n' "$host" > "$d/host.new" && mv "$d/host.new" "$d/host" || exit 1
rm -f -- "$d/moving"
requeue "$d" {entry} && drain
state=queued; [ -s "$d/pid" ] && state=new
echo "{MARK} submitted $host/{token} $state"
"""


def discard_script(token: str) -> str:
    """On a move's target, after the move was undone: remove the copy of the run dir it was sent, if
    it never took it (a run dir that is the source's own, in a shared home, is left alone). Answers
    `@@corral discarded`."""
    return _header(token) + f"""\
flock -w 20 9 || exit 0
took=; read -r took 2>/dev/null < "$d/host"
if copy && [ "$took" != "$host" ]; then rm -rf -- "$d"; fi
echo "{MARK} discarded"
"""


def settle_script(token: str, taken: bool, configured: Sequence[str] = ()) -> str:
    """Finish a move on the machine the task left. `taken`: the target holds it, so this machine's own
    copy of its run dir goes (where the home is shared, the target has made it its own already);
    otherwise it goes back into this machine's queue under its old entry. Answers `@@corral settled`
    (`settled cancelled`: it was cancelled here after it left, so the target must cancel it), or
    `@@corral busy` (the lock; the next status pass settles it). `configured`: the machine's GPUs from
    the pool's config, for the claims library (installed as a submission installs it)."""
    if taken:  # a cancel that reached this copy after it left is named: the pool cancels it there
        finish = '  [ -e "$d/cancelled" ] && cancelled=" cancelled"\n  rm -rf -- "$d"\n'
    else:
        finish = (f'  [[ $entry =~ ^[0-9]+_[0-9]+_[0-9]+_{token}$ ]] || {{ read -r g c _ < "$d/wants"; '
                  f'entry=$(date +%s%6N)_${{g:-0}}_${{c:-0}}_{token}; }}\n'
                  '  requeue "$d" "$entry" && rm -f -- "$d/moving" && drain\n')
    return _header(token) + f"""\
flock -w 20 9 || {{ echo "{MARK} busy"; exit 0; }}
{claims.install(configured)}took= cancelled=; read -r took 2>/dev/null < "$d/host"
if [ -s "$d/moving" ] && [ "$took" = "$host" ] && read -r _ entry _ < "$d/moving"; then
{finish}fi
echo "{MARK} settled$cancelled"
"""
