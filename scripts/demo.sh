#!/usr/bin/env bash
# The main job, end to end on the local testbed: three real Slurm clusters behind their own SSH
# login nodes, Corral looking at all of them at once, then a real two-node GPU job launched
# wherever capacity is, and the queue across all clusters.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m testbed up
export CORRAL_SLURM_CONFIG="$(python3 -m testbed config-path)"
set -x
corral check
corral gpus
corral gpus H100
corral launch --dryrun --gpus H100:4 -- true
corral launch -n demo --gpus H100:2 --num-nodes 2 -- \
  'echo "rank $CORRAL_NODE_RANK of $CORRAL_NUM_NODES on $(hostname): GPUs $CUDA_VISIBLE_DEVICES, job $CORRAL_TASK_ID"'
corral launch -d -n demo-sweep --num-jobs 6 --gpus gpu:1 -- 'echo "sweep rank $CORRAL_JOB_RANK"'
corral queue
corral api info
corral launch -c demo-dev --gpus H100:1 --num-nodes 2 --idle-minutes 5
corral exec demo-dev -- 'echo "exec on $(hostname), rank $CORRAL_NODE_RANK"'
corral ssh demo-dev -- hostname
ssh -F "${CORRAL_HOME:-$HOME/.corral}/ssh_config" demo-dev 'echo "plain ssh (as editors use it) on $(hostname), job $SLURM_JOB_ID"'
corral status
corral down demo-dev
job=$(corral jobs launch -d -n demo-managed --gpus gpu:1 -- 'echo "managed attempt $CORRAL_ATTEMPT on $CORRAL_CLUSTER"')
corral jobs logs "$job"  # follows it through any recovery to its end, and exits as it ended
corral jobs events "$job"
corral server status
corral server stop
