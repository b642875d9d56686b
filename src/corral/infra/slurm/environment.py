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

from collections.abc import Iterable

# sbatch's input variables for the accounting options (by long option name), which stay unless the
# job names its own.
ACCOUNTING = {"account": "SBATCH_ACCOUNT", "qos": "SBATCH_QOS", "reservation": "SBATCH_RESERVATION",
              "wckey": "SBATCH_WCKEY"}

# Unset by name, or every variable with the prefix (bash's own `${!PREFIX*}`: no process).
_NAMES = ("SLURM_TIME_FORMAT", "SLURM_CLUSTERS", "SLURM_BITSTR_LEN")
_PREFIXES = ("SQUEUE_", "SINFO_", "SACCT_", "SCONTROL_", "SCANCEL_")

PRELUDE = (
    f"unset {' '.join(_NAMES)} {' '.join('${!' + p + '*}' for p in _PREFIXES)}\n"
    f"for corral_v in ${{!SBATCH_*}}; do case $corral_v in {'|'.join(sorted(ACCOUNTING.values()))}) ;; "
    '*) unset "$corral_v" ;; esac; done; unset corral_v\n'
)


def unset_named(option_names: Iterable[str]) -> str:
    """`unset …; ` for the accounting variables of the options a job names itself (long names, as
    sbatch_script.parse_options gives them), or nothing."""
    named = sorted({ACCOUNTING[name] for name in option_names if name in ACCOUNTING})
    return f"unset {' '.join(named)}; " if named else ""
