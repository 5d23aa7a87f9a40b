#!/bin/bash
# The jobs the two-node cluster runs, on node-a once both nodes take jobs
# (cluster.sh runs this there), all under srun --mpi=pmix across both
# nodes: test_multinode with 4 tasks, two per node (shm inside a node,
# verbs between them; messages in every rendezvous mode, PUT, GET, fence,
# collectives on the world and on an uneven geometry), and with --kill (the
# last task killed; the others must fail it and go on); test_mpirun with 4
# tasks two per node, then 8, four per node on two vCPUs each
# (oversubscribed); ami_info -p from every task, which must name shm for
# each peer on its node and verbs for each on the other; last, node-b
# stopped whole while a job runs (test_multinode --stop-node): node-a's
# tasks must fail node-b's and go on, and the step must end with Slurm's
# node failure, not hang. Every step runs; the exit status is 0 only when
# all passed.
# usage: suite.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: suite.sh BUILD_DIR}
# Frames between the VMs are lost when a burst finds the receiving guest
# busy, and rxe resends go-back-N without congestion control: as for
# rxe_lossy (tests/rxe/meson.build), a longer RC ACK timeout (2^17 x 4.096
# us) and RDMA in pieces of 16 KiB, since rxe counts retries per work
# request. srun passes the environment on to every task.
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
# Each task's "peer task P: BACKEND" lines against the nodes srun put the
# tasks on.
peers_step() {
  local out
  out=$(timeout -k 10 120 srun --mpi=pmix --label -N 2 -n 4 --ntasks-per-node=2 \
    bash -c 'echo "node $SLURM_NODEID"; exec "$0" -p' "$build/tools/ami_info" 2>&1)
  echo "$out" | grep -E "node [0-9]|peer task"
  awk -F': ' '
    $2 ~ /^node / { split($2, w, " "); node[$1 + 0] = w[2]; next }
    $2 ~ /^# peer task / { split($2, w, " "); lines[++n] = ($1 + 0) " " (w[4] + 0) " " $3 }
    END {
      if (n != 12) { print "expected 12 peer lines (4 tasks, 3 peers each), got " n; exit 1 }
      for (i = 1; i <= n; ++i) {
        split(lines[i], f, " ")
        want = node[f[1]] == node[f[2]] ? "shm" : "verbs"
        if (f[3] != want) { print "task " f[1] ": peer " f[2] " by " f[3] ", not " want; bad = 1 }
      }
      exit bad
    }' <<<"$out"
}
step ami_info_peers peers_step
# node-b's VM paused once the job has talked (cluster.sh does it when the
# job asks): what counts is that both tasks on node-a say their tests
# passed, and that srun ends by itself, saying that node-b failed (Slurm
# 22.05's srun then exits 0: the tasks it heard from ended well).
stop_step() {
  local out rc start=$SECONDS
  : "${MULTINODE_SHARED:?set by node.sh: where to ask cluster.sh to stop node-b}"
  rm -f "$MULTINODE_SHARED/cont-b"
  out=$(timeout -k 10 240 srun --mpi=pmix --label --kill-on-bad-exit=0 -N 2 -n 4 --ntasks-per-node=2 \
    "$build/tests/multinode/test_multinode" --stop-node="$MULTINODE_SHARED/stop-b" 2>&1)
  rc=$?
  touch "$MULTINODE_SHARED/cont-b"
  echo "$out"
  echo "srun ended with status $rc after $((SECONDS - start)) s"
  ((rc != 124 && rc != 137)) || { echo "srun did not end by itself"; return 1; }
  grep -q "error: Node failure on node-b" <<<"$out" || { echo "srun did not say that node-b failed"; return 1; }
  (($(grep -c "^[01]: .*Status: SUCCESS!" <<<"$out") == 2))
}
step node_stopped stop_step
((${#failed[@]} == 0)) || { echo "failed: ${failed[*]}"; exit 1; }
