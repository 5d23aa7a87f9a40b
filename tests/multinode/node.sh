#!/bin/bash
# One node of the two-node Slurm cluster that cluster.sh brings up, run as
# root inside its soft-RoCE VM (tests/rxe/ami-vm-pair starts one on each
# VM). Both nodes: munged with the host's key (the host root is every
# guest's read-only root, so the key is the same file on both), and slurmd
# as node-a or node-b. Node a also runs slurmctld, waits until both nodes
# take jobs, runs COMMAND there and says it is done in the shared directory;
# node b serves until then. Daemons' state, spool, sockets and logs are in
# the guest's own /run; the logs are copied into the shared directory when
# COMMAND fails.
#
# usage: node.sh a SHARED_DIR -- COMMAND [ARGS...]
#        node.sh b SHARED_DIR
set -uo pipefail
role=${1:?usage: node.sh a|b SHARED_DIR [-- COMMAND...]}
shared=${2:?usage: node.sh a|b SHARED_DIR [-- COMMAND...]}
shift 2
[[ ${1:-} == -- ]] && shift
here=$(cd "$(dirname "$0")" && pwd)

readonly NODE_A=10.56.0.1 NODE_B=10.56.0.2
readonly CTLD_PORT=6817 SLURMD_PORT=6818
readonly UP_TIMEOUT=90  # both nodes taking jobs, from this node's start (a TCG guest is slow)

run=/run/ami-cluster
mkdir -p "$run/state" "$run/spool" "$run/log" "$run/munge"
# The node's name is its host name (slurmctld checks it is the controller),
# and slurmd wants a cgroup file system even with no cgroup plugin in use.
hostname "node-$role"
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 none /sys/fs/cgroup ||
  { echo "node $role: cannot mount cgroup2 on /sys/fs/cgroup"; exit 1; }
mkdir -p /sys/fs/cgroup/system.slice  # where systemd would have put slurmstepd's scope
for controller in cpuset cpu memory pids; do
  echo "+$controller" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
  echo "+$controller" >/sys/fs/cgroup/system.slice/cgroup.subtree_control 2>/dev/null
done
pids=()
# The daemons are asked to end, then killed after 10 s: a slurmd whose
# node was paused, or whose controller is gone, may not end by itself.
cleanup() {
  local pid i
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for ((i = 0; i < 100; ++i)); do
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && break; done
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
}
trap cleanup EXIT
keep_logs() {
  mkdir -p "$shared/logs-$role"
  cp "$run"/log/* "$shared/logs-$role/" 2>/dev/null
}

# munge, on a socket of its own: root runs it (--force), with the host's
# key and nothing written outside /run.
munged --force -S "$run/munge/socket" --key-file /etc/munge/munge.key --pid-file "$run/munge/pid" \
  --seed-file "$run/munge/seed" --log-file "$run/log/munged.log" ||
  { echo "node $role: munged did not start"; cat "$run/log/munged.log"; exit 1; }

# The same configuration on both nodes: auth by munge, no cgroups, more
# CPUs than the guest has (tests busy-poll and may oversubscribe), PMIx, a
# node that stops answering declared down (and its jobs failed) in 30 s.
cat >"$run/slurm.conf" <<EOF
ClusterName=ami-multinode
SlurmctldHost=node-a($NODE_A)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$run/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
MailProg=/bin/true
StateSaveLocation=$run/state
SlurmdSpoolDir=$run/spool
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd.pid
SlurmctldLogFile=$run/log/slurmctld.log
SlurmdLogFile=$run/log/slurmd.log
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
KillWait=5
SlurmdTimeout=30
NodeName=node-a NodeAddr=$NODE_A CPUs=8 State=UNKNOWN
NodeName=node-b NodeAddr=$NODE_B CPUs=8 State=UNKNOWN
PartitionName=ami Nodes=node-a,node-b Default=YES MaxTime=15 State=UP OverSubscribe=FORCE:8
EOF
# Without systemd in the guest, slurmd makes its cgroup directory itself.
cat >"$run/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v2
IgnoreSystemd=yes
EOF
export SLURM_CONF=$run/slurm.conf

if [[ $role == a ]]; then
  slurmctld -D >/dev/null 2>&1 &
  pids+=($!)
fi
slurmd -D -N "node-$role" >/dev/null 2>&1 &
pids+=($!)

if [[ $role == b ]]; then
  # Serve until node a says the cluster is done (or its VM went away:
  # ami-vm-pair then stops this one).
  until [[ -e $shared/done ]]; do sleep 0.5; done
  [[ -e $shared/failed ]] && keep_logs
  echo "node b: the cluster is done"
  exit 0
fi

deadline=$((SECONDS + UP_TIMEOUT))
until (($(sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc)') == 2)); do
  if ((SECONDS > deadline)); then
    echo "FAIL: the two-node cluster did not come up within ${UP_TIMEOUT} s"
    sinfo -N 2>&1
    keep_logs
    touch "$shared/failed" "$shared/done"
    exit 1
  fi
  sleep 0.5
done
echo "node a: two-node cluster up after $SECONDS s: $(sinfo -h -N -o '%N:%t' | paste -sd' ')"
# Where a job asks for node-b to stop (cluster.sh). (Not an AMI_* name:
# ami warns of AMI_* variables it does not know.)
export MULTINODE_SHARED=$shared
"$@"
rc=$?
((rc != 0)) && { keep_logs; touch "$shared/failed"; }
touch "$shared/done"
exit "$rc"
