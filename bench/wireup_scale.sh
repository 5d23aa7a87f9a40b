#!/usr/bin/env bash
# bench/wireup_scale.sh — the TCP bootstrap's allgather as the job grows:
# bench/wireup_sim (N ranks of the real TcpBootstrap, threads on loopback,
# spread over processes) for N = 64, 128, ... up to --max-n, one row per N:
# the allgather's time (the median of REPEATS_SMALL runs up to N = 1024, of
# REPEATS_LARGE above), the bytes the busiest rank and the mean rank sent in
# one allgather, the most any rank sent to form the job, resident memory and
# descriptors per rank (see bench/wireup_sim.cpp for every column). The
# times and the busiest rank's bytes are drawn, log-log, beside the star
# allgather's measured numbers (bench/wireup_star.dat), which were taken with
# the Client's address blobs of their time, not with this run's blob size.
#
# An N this host cannot run gets a line saying why instead of a row: more
# threads than the kernel has task ids left, more descriptors than rank 0
# may open (ulimit -n), or, found while running, more resident memory than
# wireup_sim allows itself (80% of MemAvailable): nothing is estimated.
#
# Then the lanes: a ring job of 8 processes (bench/wireup_ring.sh), each
# task talking only to its two neighbours, reports the queue pairs (verbs)
# or segments (shm) each task made, which wire-up on first use keeps at 2
# per context, and the first round trip to a neighbour (which connects the
# lane) against the warm round trip on it: on this host over shm, and with
# --rxe in the soft-RoCE VM (tests/rxe/ami-vm) over verbs; each once
# bootstrapped over TCP (every address at start) and once under mpirun
# (PMIx: addresses fetched on first use, 2 per task), where mpirun exists.
#
# Written to OUT_DIR: wireup_scale.tsv (the rows, and a comment per N that
# did not run), wireup_scale.txt (everything printed), wireup_time.dat/.png
# and wireup_bytes.dat/.png.
#
# usage: bench/wireup_scale.sh [--max-n N (16384)] [--blob-bytes B (192)] [--rxe] [build-dir]
#        REPEATS_SMALL=5 REPEATS_LARGE=1
#        OUT_DIR=<build-dir>/bench-results
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_N=16384
BLOB_BYTES=192
RXE=0
while (($#)); do
  case $1 in
    --max-n) MAX_N=${2:?--max-n needs a number}; shift 2 ;;
    --blob-bytes) BLOB_BYTES=${2:?--blob-bytes needs a number}; shift 2 ;;
    --rxe) RXE=1; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "wireup_scale.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
BUILD=${1:-build}
REPEATS_SMALL=${REPEATS_SMALL:-5}
REPEATS_LARGE=${REPEATS_LARGE:-1}
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
RANKS_PER_PROCESS=1024
SIM=$BUILD/bench/wireup_sim

[[ -f $BUILD/build.ninja ]] || meson setup "$BUILD" >/dev/null
meson compile -C "$BUILD" bench/wireup_sim bench/ami_wireup_ring >/dev/null
mkdir -p "$OUT_DIR"
tsv=$OUT_DIR/wireup_scale.tsv
exec > >(tee "$OUT_DIR/wireup_scale.txt") 2>&1

# Why N cannot start on this host, or nothing. Every rank is a thread, so
# the job needs N task ids besides those in use; rank 0 alone holds a socket
# per rank.
cannot_start() {
  local n=$1 pid_max in_use processes fds
  pid_max=$(cat /proc/sys/kernel/pid_max)
  in_use=$(ls -d /proc/[0-9]*/task/* 2>/dev/null | wc -l)
  processes=$(( 1 + (n - 1 + RANKS_PER_PROCESS - 1) / RANKS_PER_PROCESS ))
  if (( n + processes > pid_max - in_use )); then
    echo "needs $((n + processes)) threads, the kernel has $((pid_max - in_use)) task ids left (pid_max $pid_max, $in_use in use)"
    return
  fi
  fds=$(ulimit -n)
  if [[ $fds != unlimited ]] && (( n - 1 + 64 > fds )); then
    echo "rank 0 needs $((n - 1 + 64)) descriptors, ulimit -n is $fds"
  fi
}

echo "wireup_scale: blob $BLOB_BYTES bytes, N up to $MAX_N, on $(nproc) cores, $(awk '/MemAvailable/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo) available"
"$SIM" --header >"$tsv"
for ((n = 64; n <= MAX_N; n *= 2)); do
  reps=$REPEATS_LARGE
  ((n <= 1024)) && reps=$REPEATS_SMALL
  why=$(cannot_start "$n")
  if [[ -n $why ]]; then
    echo "# N=$n not run: $why" | tee -a "$tsv"
    continue
  fi
  available=$(awk '/MemAvailable/ { print int($2 / 1024) }' /proc/meminfo)
  status=0
  log=$OUT_DIR/wireup_sim_$n.log
  row=$("$SIM" --ranks "$n" --blob-bytes "$BLOB_BYTES" --repeats "$reps" 2>"$log") || status=$?
  if ((status == 0)); then
    echo "$row" >>"$tsv"
    printf '%s\n' "$row"
    # Listeners' logs: connections a listener refused or dropped (under a
    # connect storm rank 0 drops the oldest and those ranks connect again).
    [[ ! -s $log ]] || echo "  (N=$n: $(wc -l <"$log") line(s) of listeners' logs in $log)"
  elif ((status == 3)); then
    echo "# N=$n not run to the end: $(grep -o 'stopped: .*' "$log"); MemAvailable was $available MiB" | tee -a "$tsv"
  else
    grep '^wireup_sim:' "$log" | sed "s/^/# N=$n failed: /" | tee -a "$tsv"
  fi
  [[ -s $log ]] || rm -f "$log"
done

# The plots: this run's column and the star's, by N, "-" where one has none.
star=bench/wireup_star.dat
table() {  # table TREE_COLUMN STAR_COLUMN HEADER
  awk -v tc="$1" -v sc="$2" -v header="$3" '
    /^#/ || NF == 0 { next }
    !seen[FILENAME]++ { for (i = 1; i <= NF; i++) col[FILENAME, $i] = i; next }
    FILENAME == ARGV[1] { tree[$1] = $(col[FILENAME, tc]); n[$1] = 1 }
    FILENAME == ARGV[2] { old[$1] = $(col[FILENAME, sc]); n[$1] = 1 }
    END {
      print header
      for (x in n) print x, (x in tree ? tree[x] : "-"), (x in old ? old[x] : "-") | "sort -n"
    }' "$tsv" "$star"
}
table time_s time_s "n tree star" >"$OUT_DIR/wireup_time.dat"
table busiest_bytes busiest_bytes "n tree star" >"$OUT_DIR/wireup_bytes.dat"
bench/plot.sh --count-x --pairs -x "ranks (N)" -y "allgather time [s]" \
  -t "TCP bootstrap allgather: the tree ($BLOB_BYTES B blobs) and the star (as measured before it, its own blobs)" \
  "$OUT_DIR/wireup_time.dat" "$OUT_DIR/wireup_time.png" || true
bench/plot.sh --count-x --pairs -x "ranks (N)" -y "bytes sent by the busiest rank in one allgather [B]" \
  -t "TCP bootstrap allgather: the tree ($BLOB_BYTES B blobs) and the star (as measured before it, its own blobs)" \
  "$OUT_DIR/wireup_bytes.dat" "$OUT_DIR/wireup_bytes.png" || true
echo "wireup_scale: $tsv, $OUT_DIR/wireup_time.png, $OUT_DIR/wireup_bytes.png"

echo
echo "ring of 8 tasks, each talking to its two neighbours, over shm on this host:"
bench/wireup_ring.sh "$BUILD" 8 AMI_BACKENDS=self,shm | tail -1
have_mpirun=0
command -v mpirun >/dev/null && mpirun --version 2>&1 | grep -q "Open MPI" && have_mpirun=1
if ((have_mpirun)); then
  echo "the same under mpirun (PMIx: each address fetched when first needed):"
  LAUNCHER=mpirun bench/wireup_ring.sh "$BUILD" 8 AMI_BACKENDS=self,shm | tail -1
else
  echo "(no Open MPI mpirun here: the PMIx ring is not run)"
fi
if ((RXE)); then
  echo "ring of 8 tasks over verbs in the soft-RoCE VM (the handshake on first use; then rdma_cm on first"
  echo "use; then under mpirun, addresses fetched on first use, by each):"
  build_abs=$(cd "$BUILD" && pwd)
  shares=(--share "$PWD")
  [[ $build_abs == "$PWD"/* ]] || shares+=(--share "$build_abs")
  pmix_ring=true
  ((have_mpirun)) && pmix_ring="LAUNCHER=mpirun bench/wireup_ring.sh '$build_abs' 8 AMI_BACKENDS=self,verbs AMI_VERBS_CM=off | tail -1 &&
    LAUNCHER=mpirun bench/wireup_ring.sh '$build_abs' 8 AMI_BACKENDS=self,verbs AMI_VERBS_CM=on | tail -1"
  tests/rxe/ami-vm --timeout 600 "${shares[@]}" -- \
    bash -c "cd '$PWD' && bench/wireup_ring.sh '$build_abs' 8 AMI_BACKENDS=self,verbs AMI_VERBS_CM=off | tail -1 &&
             bench/wireup_ring.sh '$build_abs' 8 AMI_BACKENDS=self,verbs AMI_VERBS_CM=on | tail -1 &&
             $pmix_ring"
fi
