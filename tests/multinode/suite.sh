#!/bin/bash
# The jobs the two-node cluster runs, on node-a once both nodes take jobs
# (cluster.sh runs this there), all under srun --mpi=pmix across both
# nodes: test_multinode with 4 tasks, two per node (shm inside a node,
# verbs between them; messages in every rendezvous mode, PUT, GET, fence,
# collectives on the world and on an uneven geometry), and with --kill (the
# last task killed; the others must fail it and go on); test_mpirun with 4
# tasks two per node, then 8, four per node on two vCPUs each
# (oversubscribed). Every step runs; the exit status is 0 only when all
# passed.
# usage: suite.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: suite.sh BUILD_DIR}
# The link between the VMs is a qemu socket that drops frames when a burst
# finds the other guest busy, and rxe resends go-back-N without congestion
# control: as for rxe_lossy (tests/rxe/meson.build), a longer RC ACK timeout
# (2^17 x 4.096 us) and RDMA in pieces of 16 KiB, since rxe counts retries
# per work request. srun passes the environment on to every task.
export AMI_VERBS_TIMEOUT=17 AMI_VERBS_MAX_RDMA=16384
failed=()
step() {  # step NAME COMMAND... (a command or a function of this script)
  local name=$1 start=$SECONDS rc
  shift
  echo "=== $name"
  if declare -F "$1" >/dev/null; then "$@"; else timeout -k 10 300 "$@"; fi
  rc=$?
  if ((rc == 0)); then echo "=== ok: $name ($((SECONDS - start)) s)"; else
    echo "=== FAIL: $name: exit $rc ($((SECONDS - start)) s)"
    failed+=("$name")
  fi
}
step multinode_N2_n4 srun --mpi=pmix --label -N 2 -n 4 --ntasks-per-node=2 "$build/tests/multinode/test_multinode"
# A killed task ends the step with an error; what counts is that each of
# the three others says its tests passed.
kill_step() {
  local out
  out=$(timeout -k 10 300 srun --mpi=pmix --label --kill-on-bad-exit=0 --wait=0 -N 2 -n 4 --ntasks-per-node=2 \
    "$build/tests/multinode/test_multinode" --kill 2>&1)
  echo "$out"
  (($(grep -c "Status: SUCCESS!" <<<"$out") == 3))
}
step multinode_kill kill_step
step srun_N2_n4 srun --mpi=pmix --label -N 2 -n 4 --ntasks-per-node=2 "$build/tests/mpi/test_mpirun" --ranks=4
# (Left to Slurm, -n 8 puts seven tasks on one node and one on the other.)
step srun_N2_n8 srun --mpi=pmix --label -N 2 -n 8 --ntasks-per-node=4 "$build/tests/mpi/test_mpirun" --ranks=8
((${#failed[@]} == 0)) || { echo "failed: ${failed[*]}"; exit 1; }
