#!/usr/bin/env bash
# The whole test suite: unit tests, and integration tests against the real local Slurm testbed
# (brought up by the tests themselves, and down again if they started it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m pytest "$@"
