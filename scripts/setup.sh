#!/usr/bin/env bash
# Install what Corral and its testbed need on a fresh Debian 12 machine (as root): the Slurm, munge,
# MariaDB and OpenSSH packages from Debian, and Corral itself with its test extras from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e '.[test]'
python3 -m testbed install
