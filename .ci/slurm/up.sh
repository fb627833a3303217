#!/usr/bin/env bash
# Bring up a real two-node SLURM on this host for the SLURM tests (tests/slurm/) and CI:
# Debian's slurm-wlm + munge (Slurm 22.05), started by hand as root (no systemd), two nodes `node1` and
# `node2` (two slurmd daemons, `slurmd -N NAME`, each with its own port, spool dir, pid and log file),
# partitions `cpu` (default) and `gpu-a100` over both, and 4 fake A100 GPUs per node declared as GRES
# over character devices made with mknod (no driver: jobs get CUDA_VISIBLE_DEVICES, no GPU behind it).
# Each node has its own loopback address (node1 127.0.1.1, node2 127.0.1.2; all of 127/8 is this
# host), so a multi-node job sees two nodes with two addresses, and Ray, which replaces 127.0.0.1 by
# the interface address, keeps them (tests may only use loopback addresses).
# The node advertises more CPUs and memory than the machine has (SlurmdParameters=config_overrides),
# so profiles/slurm runs unchanged: its A100-sized requests (16 CPUs, 128 GB) fit the fake node.
#
# Usage (root): .ci/slurm/up.sh            stop with .ci/slurm/down.sh
# Env: LLMRNN_SLURM_ROOT [/tmp/llmrnn-slurm]  state, logs, fake devices
#      LLMRNN_SLURM_CPUS [64]  LLMRNN_SLURM_MEM_MB [1000000]  what each fake node advertises
# Exit codes: 0 up (or already up), 2 not root / cannot install, 1 daemons did not come up.
set -euo pipefail
R=${LLMRNN_SLURM_ROOT:-/tmp/llmrnn-slurm}
CPUS=${LLMRNN_SLURM_CPUS:-64}
MEM_MB=${LLMRNN_SLURM_MEM_MB:-1000000}

if [ "$(id -u)" != 0 ]; then
  echo ".ci/slurm/up.sh: needs root (starts munged, slurmctld, slurmd); skipping" >&2
  exit 2
fi
if ! [ -x /usr/sbin/slurmctld ] || ! [ -x /usr/sbin/slurmd ] || ! [ -x /usr/sbin/munged ] \
   || ! command -v sbatch >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  if ! command -v apt-get >/dev/null; then
    echo ".ci/slurm/up.sh: slurm-wlm/munge missing and no apt-get to install them" >&2
    exit 2
  fi
  echo ".ci/slurm/up.sh: installing slurm-wlm munge slurm-client (Debian packages)" >&2
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge slurm-client >/dev/null; } \
    || { echo ".ci/slurm/up.sh: apt-get install slurm-wlm munge slurm-client failed" >&2; exit 2; }
fi

if [ -f "$R/run/slurmctld.pid" ] && kill -0 "$(cat "$R/run/slurmctld.pid")" 2>/dev/null \
   && sinfo -h -o %T 2>/dev/null | grep -q -E 'idle|mix|alloc'; then
  echo ".ci/slurm/up.sh: already up ($R)" >&2
  sinfo
  exit 0
fi
if [ -e /etc/slurm/slurm.conf ] && [ "$(readlink -f /etc/slurm/slurm.conf)" != "$(readlink -f "$R/etc/slurm.conf" 2>/dev/null || echo none)" ]; then
  echo ".ci/slurm/up.sh: /etc/slurm/slurm.conf exists and is not ours; refusing to replace a real SLURM config" >&2
  exit 2
fi

NODES="node1 node2"
mkdir -p "$R"/etc "$R"/spool/ctld "$R"/log "$R"/run "$R"/fakegpu /run/munge /etc/slurm
for i in 0 1 2 3 4 5 6 7; do [ -e "$R/fakegpu/nvidia$i" ] || mknod "$R/fakegpu/nvidia$i" c 195 "$i"; done
for n in $NODES; do mkdir -p "$R/spool/d/$n"; done
cat > "$R/etc/slurm.conf" <<CONF
ClusterName=llmrnn-local
SlurmctldHost=localhost
AuthType=auth/munge
SlurmUser=root
StateSaveLocation=$R/spool/ctld
# %n: the node name, one spool dir, pid file and log per slurmd (multiple-slurmd support)
SlurmdSpoolDir=$R/spool/d/%n
SlurmctldPidFile=$R/run/slurmctld.pid
SlurmdPidFile=$R/run/slurmd-%n.pid
SlurmctldLogFile=$R/log/slurmctld.log
SlurmdLogFile=$R/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
# keep finished jobs visible to squeue/scontrol for an hour: there is no accounting daemon
MinJobAge=3600
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
GresTypes=gpu
NodeName=node1 NodeHostname=$(hostname) NodeAddr=127.0.1.1 Port=17001 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:a100:4 State=UNKNOWN
NodeName=node2 NodeHostname=$(hostname) NodeAddr=127.0.1.2 Port=17002 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:a100:4 State=UNKNOWN
# Preemption as a preemptible partition has it: a job in urgent (higher PriorityTier) that needs a node of
# preemptible takes it; the preempted job gets SIGTERM, GraceTime seconds, then SIGKILL, and is requeued
# (PreemptMode=REQUEUE). cpu and gpu-a100 are never preempted.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=cpu Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP PreemptMode=OFF
PartitionName=gpu-a100 Nodes=node[1-2] MaxTime=INFINITE State=UP PreemptMode=OFF
PartitionName=preemptible Nodes=node[1-2] MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=60
PartitionName=urgent Nodes=node[1-2] MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
CONF
cat > "$R/etc/gres.conf" <<CONF
AutoDetect=off
NodeName=node1 Name=gpu Type=a100 File=$R/fakegpu/nvidia[0-3]
NodeName=node2 Name=gpu Type=a100 File=$R/fakegpu/nvidia[4-7]
CONF
# The default location is required: the executor's jobstep plugin drops SLURM_CONF before its srun.
ln -sf "$R/etc/slurm.conf" /etc/slurm/slurm.conf
ln -sf "$R/etc/gres.conf" /etc/slurm/gres.conf

chown munge:munge /run/munge
if ! { [ -e /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; }; then
  [ -s /etc/munge/munge.key ] || { command -v mungekey >/dev/null && mungekey --create --force; } || true
  su -s /bin/sh munge -c /usr/sbin/munged
  touch "$R/run/munged.ours"   # down.sh stops munged only when we started it
fi
/usr/sbin/slurmctld -i
for n in $NODES; do /usr/sbin/slurmd -N "$n"; done
for _ in $(seq 60); do
  if [ "$(sinfo -h -N -p gpu-a100 -o %T 2>/dev/null | grep -c idle)" = 2 ]; then sinfo; exit 0; fi
  sleep 1
done
echo ".ci/slurm/up.sh: the two nodes did not become idle within 60 s; logs:" >&2
tail -n 20 "$R/log/slurmctld.log" "$R"/log/slurmd-*.log >&2 || true
exit 1
