#!/usr/bin/env bash
# Stop what .ci/slurm/up.sh started (slurmctld, one slurmd per node), by pid file (munged only when up.sh
# started it), and remove its files.
R=${LLMRNN_SLURM_ROOT:-/tmp/llmrnn-slurm}
[ -d "$R" ] || { echo ".ci/slurm/down.sh: nothing to stop ($R missing)" >&2; exit 0; }
for pidfile in "$R"/run/slurmd-*.pid "$R/run/slurmctld.pid"; do
  [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null
done
sleep 2
if [ -f "$R/run/munged.ours" ] && [ -f /run/munge/munged.pid ]; then
  kill "$(cat /run/munge/munged.pid)" 2>/dev/null
fi
for f in /etc/slurm/slurm.conf /etc/slurm/gres.conf; do
  case "$(readlink "$f" 2>/dev/null)" in "$R"/*) rm -f "$f" ;; esac
done
rm -rf "$R"
exit 0
