#!/bin/bash
# Runs a test program as a job of NP tasks under Slurm's srun --mpi=pmix,
# on a private one-node Slurm cluster this script brings up for the run: a
# slurmctld and a slurmd on this host, with their configuration, state,
# spool and logs in a fresh temporary directory and ports that were free,
# no authentication (auth/none: nothing leaves the host) and no cgroups.
# Both daemons are stopped and the directory removed however the run ends;
# their logs are printed when it fails. Prints SKIPPED and exits 77 where
# Slurm or its PMIx plugin is missing, or without root (slurmd starts the
# tasks as the submitting user, which needs it).
# usage: srun.sh NP PROGRAM [ARGS...]
set -uo pipefail
np=${1:?usage: srun.sh NP PROGRAM [ARGS...]}
program=${2:?usage: srun.sh NP PROGRAM [ARGS...]}
shift 2

for tool in slurmctld slurmd srun sinfo; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: no $tool on PATH (Debian: apt-get install slurmctld slurmd slurm-client)"
    exit 77
  fi
done
if (($(id -u) != 0)); then
  echo "SKIPPED: a private Slurm cluster needs root (slurmd starts tasks as their user)"
  exit 77
fi
dir=$(mktemp -d /tmp/ami-slurm.XXXXXX)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # meson's timeout: clean up all the same
show_logs() {
  local log
  for log in "$dir"/log/*; do
    echo "---- $(basename "$log")"
    tail -n 40 "$log"
  done
}

# Two ports nobody listens on (the kernel picks them; they stay free for
# the moment it takes to start the daemons).
read -r ctld_port slurmd_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)
node=$(hostname -s)
mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/tmp"
# TmpFS is the cluster's own: Slurm's PMIx plugin makes each step a
# directory there named by job and step id only (spmix_appdir_UID_JOB.STEP),
# every private cluster numbers its jobs from 1, and a directory left in a
# shared /tmp by an earlier cluster fails the next step's launch.
# More CPUs than the host has, and partitions that oversubscribe: a test
# job may have more tasks than cores (the tasks busy-poll; they are tests).
cat >"$dir/slurm.conf" <<EOF
ClusterName=ami-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
MailProg=/bin/true
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
TmpFS=$dir/tmp
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=10 State=UP OverSubscribe=FORCE:8
EOF
export SLURM_CONF=$dir/slurm.conf

slurmctld -D -c >/dev/null 2>&1 &
pids+=($!)
slurmd -D -N "$node" >/dev/null 2>&1 &
pids+=($!)

# Until the node takes jobs: 30 s at most.
deadline=$((SECONDS + 30))
until sinfo -h -n "$node" -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; do
  if ((SECONDS > deadline)); then
    echo "FAIL: the private Slurm cluster did not come up within 30 s"
    show_logs
    exit 1
  fi
  sleep 0.2
done

if ! srun --mpi=list 2>&1 | grep -qw pmix; then
  echo "SKIPPED: this Slurm has no PMIx plugin (Debian: slurm-wlm-basic-plugins ships mpi_pmix)"
  exit 77
fi
echo "srun --mpi=pmix -n $np $program --ranks=$np $* (Slurm $(sinfo -V | awk '{print $2}'), one node)"
# The job's time is what is left of meson's 300 s after the cluster came up,
# less a margin for printing the daemons' logs when it fails.
budget=$((270 - SECONDS))
((budget < 30)) && budget=30
timeout -k 10 "$budget" srun --mpi=pmix --label -n "$np" "$program" --ranks="$np" "$@"
rc=$?
if ((rc == 124 || rc == 137)); then echo "FAIL: the job of $np did not finish within $budget s"; fi
if ((rc != 0)); then show_logs; fi
exit $rc
