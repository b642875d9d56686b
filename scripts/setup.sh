#!/usr/bin/env bash
# Install what Corral and its testbed need on a fresh Debian 12 machine (as root): the Slurm, munge,
# MariaDB and OpenSSH packages from Debian, and Corral itself with its test extras from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e '.[test]'
# An editable install compiles nothing (a wheel's does), and with PYTHONDONTWRITEBYTECODE set no command
# writes what it compiled: each `corral` call then compiled Corral's modules again, ~50 ms, and the
# server's start ~0.15 s more. Compile them once here.
python3 -m compileall -q src > /dev/null
python3 -m testbed install
