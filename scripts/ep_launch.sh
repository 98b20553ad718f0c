#!/usr/bin/env bash
# Start one process per GPU for the expert-parallel programs (e.g. build/mxmoe_ep_test).
#
#   scripts/ep_launch.sh NGPU CMD [ARGS...]
#
# Each process gets RANK = LOCAL_RANK = 0..NGPU-1, WORLD_SIZE = NGPU, MXMOE_EP_ID_FILE (a path in
# a fresh temp dir; rank 0 writes the NCCL unique id there, the others read it), MXMOE_EP_SEED
# (one fresh value shared by all ranks) and NCCL_NVLS_ENABLE=0 (mxmoe never uses NVLink
# multicast). Every process runs under `timeout` (MXMOE_EP_TIMEOUT seconds, default 300), so a
# hang ends as exit 124. Output lines are prefixed by the rank. The exit status is the first
# non-zero status of any rank (0 when all pass). With fewer GPUs than NGPU the program itself
# prints SKIP and exits 0.
set -u -o pipefail

if [[ $# -lt 2 ]] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 NGPU CMD [ARGS...]   (e.g. $0 2 build/mxmoe_ep_test)" >&2
  exit 2
fi
NGPU=$1
shift

TMP=$(mktemp -d "${TMPDIR:-/tmp}/mxmoe_ep.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

export WORLD_SIZE=$NGPU
export MXMOE_EP_ID_FILE="$TMP/nccl_id"
export MXMOE_EP_SEED=${MXMOE_EP_SEED:-$(( (RANDOM << 15) | RANDOM ))}
if [[ -n "${NCCL_NVLS_ENABLE:-}" && "${NCCL_NVLS_ENABLE}" != "0" ]]; then
  echo "ep_launch.sh: NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE} overridden to 0 (no NVLink multicast)" >&2
fi
export NCCL_NVLS_ENABLE=0
LIMIT=${MXMOE_EP_TIMEOUT:-300}

echo "ep_launch.sh: $NGPU process(es), seed $MXMOE_EP_SEED, id file $MXMOE_EP_ID_FILE, timeout ${LIMIT}s: $*"
pids=()
for ((r = 0; r < NGPU; r++)); do
  RANK=$r LOCAL_RANK=$r timeout --kill-after=10 "$LIMIT" "$@" > >(sed -u "s/^/[p$r] /") 2>&1 &
  pids+=($!)
done

status=0
for ((r = 0; r < NGPU; r++)); do
  wait "${pids[$r]}"
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "ep_launch.sh: rank $r exited with $rc$([[ $rc -eq 124 ]] && echo ' (timeout)')" >&2
    [[ $status -eq 0 ]] && status=$rc
  fi
done
wait  # the output filters
exit $status
