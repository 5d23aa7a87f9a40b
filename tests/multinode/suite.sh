#!/bin/bash
# The jobs the two-node cluster runs, on node-a once both nodes take jobs
# (cluster.sh runs this there): test_mpirun under srun --mpi=pmix across
# both nodes, 4 tasks two per node (each task reaches its node's other task
# by shm and the other node's by verbs), then 8 tasks, four per node on
# two vCPUs each (oversubscribed). Every step runs; the exit status is 0
# only when all passed.
# usage: suite.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: suite.sh BUILD_DIR}
failed=()
step() {  # step NAME COMMAND...
  local name=$1 start=$SECONDS rc
  shift
  echo "=== $name"
  timeout -k 10 300 "$@"
  rc=$?
  if ((rc == 0)); then echo "=== ok: $name ($((SECONDS - start)) s)"; else
    echo "=== FAIL: $name: exit $rc ($((SECONDS - start)) s)"
    failed+=("$name")
  fi
}
step srun_N2_n4 srun --mpi=pmix --label -N 2 -n 4 --ntasks-per-node=2 "$build/tests/mpi/test_mpirun" --ranks=4
# Four busy-polling tasks per two-vCPU emulated node: the kernel's rxe work
# waits for a core, so an RC ACK may come later than the default timeout
# allows (as in rxe_lossy, tests/rxe/meson.build): 2^17 x 4.096 us. (Left to
# Slurm, -n 8 puts seven tasks on one node; there even that did not do.)
step srun_N2_n8 env AMI_VERBS_TIMEOUT=17 srun --mpi=pmix --label -N 2 -n 8 --ntasks-per-node=4 \
  "$build/tests/mpi/test_mpirun" --ranks=8
((${#failed[@]} == 0)) || { echo "failed: ${failed[*]}"; exit 1; }
