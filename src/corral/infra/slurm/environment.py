"""The variables of a user's login environment that would change what Corral's Slurm commands print,
which cluster they reach, or what its `#SBATCH` lines say; unset before each script. Pure text, no I/O.

Corral's scripts run in the user's login environment (login_env.py), where people set what suits them
by hand: `SLURM_TIME_FORMAT=relative` prints "Tomorr 10:00" where Corral reads ISO times (and would
lose every submit, start and end time), `SQUEUE_FORMAT`, `SQUEUE_USERS` or `SINFO_PARTITION` change
or narrow what a query returns, `SLURM_CLUSTERS` sends commands to another cluster than the one the
login node stands for, `SCANCEL_INTERACTIVE` makes `scancel` ask for confirmation, and any
`SBATCH_*` input variable overrides the `#SBATCH` line Corral wrote (Slurm: command line, then
environment, then the script), so `SBATCH_PARTITION` or `SBATCH_OUTPUT` would put a job elsewhere or
its log where Corral never looks.

A user's accounting defaults are the exception: `SBATCH_ACCOUNT`, `SBATCH_QOS`, `SBATCH_RESERVATION`
and `SBATCH_WCKEY` still apply to a job that does not name its own (as they would to the user's own
`sbatch`); a job that names one (a profile's account, a script's `#SBATCH --qos`) gets its own,
because `unset_named` unsets the variable for that submission.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

# sbatch's input variables for the accounting options (by long option name), which stay unless the
# job names its own.
ACCOUNTING = {"account": "SBATCH_ACCOUNT", "qos": "SBATCH_QOS", "reservation": "SBATCH_RESERVATION",
              "wckey": "SBATCH_WCKEY"}

# Unset by name, or every variable with the prefix (bash's own `${!PREFIX*}`: no process).
_NAMES = ("SLURM_TIME_FORMAT", "SLURM_CLUSTERS", "SLURM_BITSTR_LEN")
_PREFIXES = ("SQUEUE_", "SINFO_", "SACCT_", "SCONTROL_", "SCANCEL_")

_KEPT = "|".join(sorted(ACCOUNTING.values()))
PRELUDE = (
    f"unset {' '.join(_NAMES)} {' '.join('${!' + p + '*}' for p in _PREFIXES)}\n"
    f'for corral_v in ${{!SBATCH_*}}; do case $corral_v in {_KEPT}) ;; *) unset "$corral_v" ;; esac; done; '
    "unset corral_v\n"
)

# The same as one line without `!`, for a command line a login shell of any kind reads (csh's take
# `!NAME` as history even between single quotes, and cannot quote a newline); `compgen` costs a fork.
_ONE_LINE_PRELUDE = (
    f"unset {' '.join(_NAMES)}; "
    f"for corral_v in $({'; '.join(f'compgen -v {p}' for p in (*_PREFIXES, 'SBATCH_'))}); do "
    f'case $corral_v in SBATCH_*) case $corral_v in {_KEPT}) continue ;; esac ;; esac; unset "$corral_v"; done; '
    "unset corral_v; "
)


def login_shell_line(script: str) -> str:
    """A one-line `script` (no `!`, no newline) as the command line ssh hands to the user's login
    shell, whatever that is: bash runs it after the login profile, as Corral's other scripts run
    (Slurm is on PATH, SLURM_CONF set, only there on many sites), with the prelude first. What the
    profile prints goes to stderr, so stdout is the script's alone: an ssh session's protocol stream,
    or the output of a command the user captures."""
    if "\n" in script or "!" in script.replace("!=", ""):
        raise ValueError(f"not a one-line script without history characters: {script!r}")
    inner = f"exec 1>&3 3>&-; {_ONE_LINE_PRELUDE}{script}"
    return f"bash -c {shlex.quote(_LOGIN_SHELL)} {shlex.quote(inner)}"


# Runs its $0 in a login bash whose stdout is stderr; the script gets the real stdout back from fd 3.
_LOGIN_SHELL = 'exec bash --login -c "$0" 3>&1 1>&2'


def unset_named(option_names: Iterable[str]) -> str:
    """`unset …; ` for the accounting variables of the options a job names itself (long names, as
    sbatch_script.parse_options gives them), or nothing."""
    named = sorted({ACCOUNTING[name] for name in option_names if name in ACCOUNTING})
    return f"unset {' '.join(named)}; " if named else ""
