#!/bin/bash
# cluster.sh: a two-node Slurm cluster of soft-RoCE VMs for the length of
# one command. Two VMs joined by one link (tests/rxe/ami-vm-pair, no loss),
# each a Slurm node (node-a 10.56.0.1, node-b 10.56.0.2) running slurmd,
# node-a also slurmctld, authenticated by munge with one key; the source
# and build directories are shared into both. COMMAND runs on node-a once
# both nodes take jobs, typically srun --mpi=pmix -N 2 -n 4 PROGRAM. The
# cluster is torn down however it ends, under ami-vm-pair's watchdog
# (--timeout) and its console-log keeping; on a failure both nodes' daemon
# logs are printed.
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
trap 'rm -rf "$shared"' EXIT
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
