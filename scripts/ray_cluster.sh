#!/usr/bin/env bash
# Start a Ray cluster over the nodes of the current SLURM allocation, run a command against it (verl's
# main_ppo for trainer.nnodes > 1), then stop the cluster. One `srun` step per node: the head on the
# first node (the one this script runs on), a worker on each other node; each gets the node's GPUs.
#
#   scripts/ray_cluster.sh [--dry-run] -- python -m verl.trainer.main_ppo trainer.nnodes=2 ...
#
# Env: SLURM_JOB_NODELIST (or LLMRNN_RAY_NODES="n1 n2", which wins), LLMRNN_RAY_PORT [6379],
#      LLMRNN_RAY_GPUS_PER_NODE [from CUDA_VISIBLE_DEVICES / SLURM_GPUS_ON_NODE, else 0],
#      LLMRNN_RAY_CPUS_PER_NODE [SLURM_CPUS_ON_NODE or nproc], LLMRNN_RAY_TIMEOUT [300] seconds
#      for all nodes to join. --dry-run prints the steps it would run and exits (no SLURM needed).
# The command sees RAY_ADDRESS=<head ip>:<port>; verl's ray.init() joins that cluster instead of
# starting its own. With one node it just runs the command (verl starts a local Ray itself).
set -euo pipefail
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: scripts/ray_cluster.sh [--dry-run] -- COMMAND..." >&2; exit 2; }

if [ -n "${LLMRNN_RAY_NODES:-}" ]; then
  read -r -a NODES <<<"$LLMRNN_RAY_NODES"
elif [ -n "${SLURM_JOB_NODELIST:-}" ]; then
  mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
else
  NODES=("$(hostname)")
fi
PORT=${LLMRNN_RAY_PORT:-6379}
if [ -n "${LLMRNN_RAY_GPUS_PER_NODE:-}" ]; then GPUS=$LLMRNN_RAY_GPUS_PER_NODE
elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then GPUS=$(awk -F, '{print NF}' <<<"$CUDA_VISIBLE_DEVICES")
else GPUS=${SLURM_GPUS_ON_NODE:-0}; fi
CPUS=${LLMRNN_RAY_CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-$(nproc)}}
TIMEOUT=${LLMRNN_RAY_TIMEOUT:-300}
HEAD=${NODES[0]}

run() {  # print (dry run) or execute a step
  if [ "$DRY" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi
}

if [ "${#NODES[@]}" -le 1 ]; then
  echo "ray_cluster: one node ($HEAD): running the command directly" >&2
  run "$@"
  exit $?
fi

if [ "$DRY" = 1 ]; then HEAD_IP="<ip of $HEAD>"
else HEAD_IP=$(srun --overlap -N1 -n1 -w "$HEAD" hostname -I | awk '{print $1}'); fi
ADDRESS="$HEAD_IP:$PORT"
echo "ray_cluster: ${#NODES[@]} nodes (${NODES[*]}), head $HEAD at $ADDRESS, $GPUS GPU(s) + $CPUS CPU(s) per node" >&2

PIDS=()
cleanup() {
  [ "$DRY" = 1 ] && return 0
  for node in "${NODES[@]}"; do srun --overlap -N1 -n1 -w "$node" ray stop --force >/dev/null 2>&1 || true; done
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

start() {  # a long-lived srun step per node; --block keeps it in the foreground of the step
  if [ "$DRY" = 1 ]; then run "$@"; else "$@" & PIDS+=("$!"); fi
}
start srun --overlap -N1 -n1 -w "$HEAD" ray start --head --node-ip-address="$HEAD_IP" --port="$PORT" \
  --num-gpus="$GPUS" --num-cpus="$CPUS" --block
[ "$DRY" = 1 ] || sleep 10
for node in "${NODES[@]:1}"; do
  start srun --overlap -N1 -n1 -w "$node" ray start --address="$ADDRESS" --num-gpus="$GPUS" \
    --num-cpus="$CPUS" --block
done

if [ "$DRY" = 0 ]; then
  want=${#NODES[@]}
  for _ in $(seq "$TIMEOUT"); do
    alive=$(RAY_ADDRESS=$ADDRESS python -c 'import ray; ray.init(); print(sum(n["Alive"] for n in ray.nodes()))' 2>/dev/null || echo 0)
    [ "$alive" -ge "$want" ] && break
    sleep 1
  done
  [ "${alive:-0}" -ge "$want" ] || { echo "ray_cluster: only ${alive:-0}/$want nodes joined in ${TIMEOUT}s" >&2; exit 1; }
fi
export RAY_ADDRESS=$ADDRESS
[ "$DRY" = 1 ] && echo "RAY_ADDRESS=$ADDRESS"
run "$@"
