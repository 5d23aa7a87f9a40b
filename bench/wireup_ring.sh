#!/bin/bash
# One job of N tasks (default 8) of bench/ami_wireup_ring on this host,
# bootstrapped over TCP on loopback, each task talking only to its two ring
# neighbours; prints each task's line and a summary: queue pairs made per
# task and shm segments mapped (wire-up on first use: 2 each with one
# context, whichever backend joins the neighbours) and the first round trip
# to a neighbour (which connects the lane) against the warm one. With
# LAUNCHER=mpirun the job is started by Open MPI's mpirun instead (PMIx):
# addresses are then fetched on first use, and the summary says how many
# each task learnt (2: its neighbours, where the TCP bootstrap gives all).
#
#   [LAUNCHER=mpirun] bench/wireup_ring.sh BUILD_DIR [N] [VAR=VALUE...]
#
# bench/wireup_scale.sh runs it inside the soft-RoCE VM (AMI_BACKENDS=self,verbs).
set -euo pipefail
build=${1:?usage: wireup_ring.sh BUILD_DIR [N] [VAR=VALUE...]}
n=${2:-8}
shift $(($# >= 2 ? 2 : 1))
prog=$build/bench/ami_wireup_ring
[[ -x $prog ]] || { echo "wireup_ring.sh: $prog is not built" >&2; exit 1; }
port=$((20000 + RANDOM % 20000))
key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pids=()
rc=0
if [[ ${LAUNCHER:-} == mpirun ]]; then
  root=(); (($(id -u) == 0)) && root=(--allow-run-as-root)
  envs=(); for v in "$@"; do envs+=(-x "$v"); done
  # Each rank's line into its own file, as below.
  timeout 180 mpirun --oversubscribe "${root[@]}" "${envs[@]}" -np "$n" \
    bash -c 'exec "$0" >"$1/$OMPI_COMM_WORLD_RANK.out" 2>"$1/$OMPI_COMM_WORLD_RANK.err"' "$prog" "$out" || rc=1
else
  for ((r = 0; r < n; r++)); do
    env AMI_RANK=$r AMI_SIZE=$n AMI_BOOTSTRAP=127.0.0.1:$port AMI_JOB_KEY=$key "$@" \
      timeout 120 "$prog" >"$out/$r.out" 2>"$out/$r.err" &
    pids+=($!)
  done
fi
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for ((r = 0; r < n; r++)); do cat "$out/$r.out"; [[ -s $out/$r.err ]] && sed "s/^/rank $r: /" "$out/$r.err" >&2; done
((rc == 0)) || { echo "wireup_ring.sh: a task failed" >&2; exit 1; }
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
lines=$(cat "$out"/*.out)
qps=$(awk '{ print $4 }' <<<"$lines" | sort -n | uniq | paste -sd/)
segs=$(awk '{ print $10 }' <<<"$lines" | sort -n | uniq | paste -sd/)
first=$(awk '{ print $6 }' <<<"$lines" | median)
warm=$(awk '{ print $8 }' <<<"$lines" | median)
learnt=$(awk '{ print $12 }' <<<"$lines" | sort -n | uniq | paste -sd/)
awk -v n="$n" -v q="$qps" -v s="$segs" -v f="$first" -v w="$warm" -v a="$learnt" 'BEGIN {
  printf "tasks %d  queue pairs per task %s  segments mapped per task %s  addresses learnt per task %s  first round trip (median over tasks) %.1f us  warm %.1f us  ratio %.1f\n",
    n, q, s, a, f, w, (w > 0 ? f / w : 0) }'
