"""Stand-ins for what cannot run on the testbed's host: a container runtime (no real one can run
here). Written into a cluster's login PATH (bed.py) and onto the SSH machines (machines.py)."""

RUNTIME_STANDIN = """#!/bin/bash
# Written by the Corral testbed: a STAND-IN for {runtime}. It runs the command on the host, noting the image
# (CORRAL_TESTBED_CONTAINER) and --nv (CORRAL_TESTBED_CONTAINER_GPUS=1).
[ "${{1-}}" = exec ] || {{ echo "{runtime} (testbed stand-in): only 'exec' is supported" >&2; exit 2; }}
shift
image=
while [ $# -gt 0 ] && [ -z "$image" ]; do
  case "$1" in
    --nv) export CORRAL_TESTBED_CONTAINER_GPUS=1; shift ;;  # the host's GPU driver, as --nv binds it
    --bind) shift 2 ;;
    --pwd) cd "$2" || exit 1; shift 2 ;;
    docker://*) image="${{1#docker://}}"; shift ;;
    *) echo "{runtime} (testbed stand-in): unexpected argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$image" ] || {{ echo "{runtime} (testbed stand-in): no docker:// image" >&2; exit 2; }}
export CORRAL_TESTBED_CONTAINER="$image"
exec "$@"
"""
