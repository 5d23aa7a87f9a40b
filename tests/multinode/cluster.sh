#!/bin/bash
# cluster.sh: a two-node Slurm cluster of soft-RoCE VMs for the length of
# one command. Two VMs joined by one link (tests/rxe/ami-vm-pair, no loss),
# each a Slurm node (node-a 10.56.0.1, node-b 10.56.0.2) running slurmd,
# node-a also slurmctld, authenticated by munge with one key; the source
# and build directories are shared into both. COMMAND runs on node-a once
# both nodes take jobs, typically srun --mpi=pmix -N 2 -n 4 PROGRAM. The
# cluster is torn down however it ends, under ami-vm-pair's watchdog
# (--timeout) and its console-log keeping; on a failure both nodes' daemon
# logs are printed. A job may stop node-b whole (its VM paused, as a node
# that hangs): COMMAND creates $MULTINODE_SHARED/stop-b, this script
# pauses node-b's qemu (SIGSTOP) and says so in stopped-b; cont-b (or the
# end of the cluster) lets it go on.
#
# usage: cluster.sh [--timeout SECONDS] [--share DIR]... -- COMMAND [ARGS...]
# Exit status: COMMAND's; 77 with SKIPPED where the VMs or Slurm cannot run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
timeout=900
shares=()
while (($#)); do
  case $1 in
    --timeout) timeout=${2:?--timeout needs a value}; shift 2 ;;
    --share) shares+=(--share "${2:?--share needs a value}"); shift 2 ;;
    --) shift; break ;;
    *) echo "usage: cluster.sh [--timeout SECONDS] [--share DIR]... -- COMMAND [ARGS...]" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "cluster.sh: no command" >&2; exit 2; }

for tool in slurmctld slurmd srun sinfo munged; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: no $tool on PATH (Debian: apt-get install slurmctld slurmd slurm-client munge)"
    exit 77
  fi
done
if [[ ! -r /etc/munge/munge.key ]]; then
  echo "SKIPPED: no readable /etc/munge/munge.key (the munge package makes one; root reads it)"
  exit 77
fi

shared=$(mktemp -d /tmp/ami-cluster.XXXXXX)

# node-b's qemu: the one of this script's descendants that connects to the
# link (node-a's listens).
node_b_qemu() {
  local pid up
  for pid in $(pgrep -f 'stream,id=link,server=off,'); do
    up=$pid
    while ((up > 1)); do
      ((up == $$)) && { echo "$pid"; return 0; }
      up=$(awk '/^PPid:/ {print $2}' "/proc/$up/status" 2>/dev/null) || break
      [[ -n $up ]] || break
    done
  done
  return 1
}
watch_stop_requests() {
  local pid
  while sleep 0.2; do
    if [[ -e $shared/stop-b ]] && pid=$(node_b_qemu); then
      kill -STOP "$pid" && echo "cluster: node-b's VM paused (qemu $pid)"
      rm -f "$shared/stop-b"
      echo "$pid" >"$shared/stopped-b"
    fi
    if [[ -e $shared/cont-b && -e $shared/stopped-b ]]; then
      kill -CONT "$(cat "$shared/stopped-b")" && echo "cluster: node-b's VM goes on"
      rm -f "$shared/cont-b" "$shared/stopped-b"
    fi
  done
}
watch_stop_requests &
watcher=$!
finish() {
  kill "$watcher" 2>/dev/null
  wait "$watcher" 2>/dev/null
  [[ -e $shared/stopped-b ]] && kill -CONT "$(cat "$shared/stopped-b")" 2>/dev/null
  rm -rf "$shared"
}
trap finish EXIT
"$here/../rxe/ami-vm-pair" --timeout "$timeout" --share "$shared" --share "$here/.." "${shares[@]}" \
  -- "$here/node.sh" a "$shared" -- "$@" \
  --- "$here/node.sh" b "$shared"
rc=$?
if ((rc != 0 && rc != 77)); then
  for log in "$shared"/logs-*/*; do
    [[ -e $log ]] || continue
    echo "---- $(basename "$(dirname "$log")")/$(basename "$log")"
    tail -n 40 "$log"
  done
fi
exit "$rc"
