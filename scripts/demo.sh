#!/usr/bin/env bash
# The main job, end to end on the local testbed: three real Slurm clusters behind their own SSH
# login nodes, then Corral looking at all of them at once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m testbed up
export CORRAL_SLURM_CONFIG="$(python3 -m testbed config-path)"
set -x
corral check
corral gpus
corral gpus H100
