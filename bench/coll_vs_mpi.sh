#!/usr/bin/env bash
# bench/coll_vs_mpi.sh — ami's collectives against Open MPI's over its
# shared-memory transport (--mca btl self,vader), in one run: barrier,
# 8-byte allreduce and 1 MiB allreduce (sums of doubles) latency at 2
# processes pinned to cores 0 and 1, and at 4 and 8 processes sharing those
# two cores (oversubscribed: both sides then yield the core when idle, as
# Open MPI does by itself there; marked as such in the table).
#
# ami's side is build/bench/ami_coll_bench (processes placed by AMI_RANK,
# AMI_SIZE and AMI_BOOTSTRAP, each pinned with taskset to core rank % 2);
# its twin bench/mpi_coll_bench.c is built here with mpicc and started by
# mpirun, bound the same way. Each program prints, per collective, the
# median over many short repetitions (short, so most are untouched by the
# scheduler) of the time per iteration; ami and MPI runs alternate, ROUNDS
# rounds, and the table shows the medians of the rounds and ami/MPI.
# Targets at 2 processes: barrier and 8 B allreduce <= 1.00, 1 MiB <= 1.10.
#
# The same runs time allreduce at the sizes in between too (BYTES, each
# with fewer iterations as it grows); the allreduce latency by size, ami and
# MPI at each job size, is printed as a second table and drawn by
# bench/plot.sh. Written to OUT_DIR: coll_vs_mpi.txt (everything printed),
# coll_vs_mpi_allreduce.dat/.png.
#
# usage: bench/coll_vs_mpi.sh [build-dir]
#        ROUNDS=5          rounds (at least 3)
#        SIZES="2 4 8"     job sizes
#        BYTES="64 512 4096 32768 262144"   allreduce sizes between 8 B and 1 MiB ("": none)
#        OVERSUB=yield     how an oversubscribed ami task waits: yield (sched_yield
#                          when idle) or sleep (yield for SPIN_US µs, default 200, then
#                          sleep on the context's event_fd(): ami_coll_bench --spin --yield)
#        NO_BUILD=1        measure the build directory as it is
#        VERBOSE=1         every run's figures on stderr
#        OUT_DIR=<build-dir>/bench-results
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-5}
SIZES=${SIZES:-"2 4 8"}
BYTES=${BYTES-64 512 4096 32768 262144}
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
NO_BUILD=${NO_BUILD:-0}
VERBOSE=${VERBOSE:-0}
PORT=${PORT:-19700}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
CORES=2
((ROUNDS >= 3)) || { echo "ROUNDS must be at least 3" >&2; exit 2; }
(($(nproc) >= CORES)) || { echo "needs $CORES cores, this host has $(nproc)" >&2; exit 2; }

check_mpi() {
  local missing=()
  command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
  command -v mpirun >/dev/null || missing+=(openmpi-bin)
  if ((${#missing[@]})); then
    echo "Open MPI is missing: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  mpirun --version 2>/dev/null | grep -q 'Open MPI' || { echo "mpirun is not Open MPI's" >&2; exit 1; }
  # (mpicc can be there without the headers it compiles against)
  echo '#include <mpi.h>' | mpicc -E -x c - >/dev/null 2>&1 ||
    { echo "mpicc finds no mpi.h: apt-get install -y libopenmpi-dev" >&2; exit 1; }
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build() {
  if [[ $NO_BUILD != 1 ]]; then
    [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
    meson compile -C "$BUILD" bench/ami_coll_bench >/dev/null
  fi
  [[ -x "$BUILD/bench/ami_coll_bench" ]] || { echo "no $BUILD/bench/ami_coll_bench" >&2; exit 1; }
  mpicc -O2 -o "$work/mpi_coll_bench" bench/mpi_coll_bench.c
}

# Iterations per repetition and repetitions, by job size: short
# repetitions, many of them; and the sweep's sizes.
args_for() {
  case $1 in
    2) echo "--iters 2000 --large-iters 20 --reps 41" ;;
    4) echo "--iters 200 --large-iters 4 --reps 21" ;;
    *) echo "--iters 100 --large-iters 2 --reps 15" ;;
  esac
  local sweep
  sweep=$(echo $BYTES | tr ' ' ',')
  [[ -z $sweep ]] || echo "--sweep $sweep"
}

# run_ami N -> the program's three lines
run_ami() {
  local n=$1 extra=() pids=() r out rc=0
  if ((n > CORES)); then
    if [[ ${OVERSUB:-yield} == sleep ]]; then extra=(--spin "${SPIN_US:-200}" --yield); else extra=(--yield); fi
  fi
  PORT=$((PORT + 1))
  for ((r = 1; r < n; r++)); do
    AMI_RANK=$r AMI_SIZE=$n AMI_BOOTSTRAP=127.0.0.1:$PORT timeout "$RUN_TIMEOUT" \
      taskset -c $((r % CORES)) "$BUILD/bench/ami_coll_bench" $(args_for "$n") "${extra[@]}" >/dev/null &
    pids+=($!)
  done
  out=$(AMI_RANK=0 AMI_SIZE=$n AMI_BOOTSTRAP=127.0.0.1:$PORT timeout "$RUN_TIMEOUT" \
        taskset -c 0 "$BUILD/bench/ami_coll_bench" $(args_for "$n") "${extra[@]}") || rc=$?
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  ((rc == 0)) || echo "ami at $n processes failed (exit $rc)" >&2
  printf '%s\n' "$out"
}

run_mpi() {
  local n=$1 bind=core
  ((n > CORES)) && bind=core:overload-allowed
  timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe -np "$n" --map-by core --bind-to "$bind" \
    --mca btl self,vader "$work/mpi_coll_bench" $(args_for "$n") 2>/dev/null ||
    echo "MPI at $n processes failed" >&2
}

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)]}'; }

declare -A samples
add() {  # add SIDE N OUTPUT
  local key value
  while read -r key value; do
    [[ -n $key ]] && samples["$1/$2/$key"]+="$value"$'\n'
  done <<<"$3"
  [[ $VERBOSE == 1 ]] && printf '# %s at %s: %s\n' "$1" "$2" "$(tr '\n' ' ' <<<"$3")" >&2
  return 0
}

row() {  # row N KEY LABEL TARGET
  local a m note=""
  a=$(printf '%s' "${samples[ami/$1/$2]:-}" | median)
  m=$(printf '%s' "${samples[mpi/$1/$2]:-}" | median)
  (($1 > CORES)) && note="oversubscribed ($1 on $CORES cores)"
  awk -v n="$1" -v l="$3" -v a="$a" -v m="$m" -v t="$4" -v note="$note" 'BEGIN {
    r = (m > 0 && a != "nan") ? sprintf("%8.3f", a / m) : "     nan"
    printf "%5s  %-16s %12s %12s  %s   %-8s %s\n", n, l, a, m, r, t, note }'
}

# by_size: allreduce latency by size, a column per side and job size,
# printed and written for plot.sh.
by_size() {
  local n side bytes key
  {
    printf '%-10s' bytes
    for n in $SIZES; do printf ' %14s %14s' "ami_${n}_procs" "MPI_${n}_procs"; done
    echo
    for bytes in 8 $BYTES 1048576; do
      key=allreduce_$bytes
      ((bytes == 1048576)) && key=allreduce_1m
      printf '%-10s' "$bytes"
      for n in $SIZES; do
        for side in ami mpi; do printf ' %14s' "$(printf '%s' "${samples[$side/$n/$key]:-}" | median)"; done
      done
      echo
    done
  } | tee "$OUT_DIR/coll_vs_mpi_allreduce.dat"
}

report() {
  echo "# ami vs $(mpirun --version 2>/dev/null | head -1) (btl self,vader), processes pinned to cores rank % $CORES"
  echo "# $ROUNDS interleaved rounds; each figure is the median of the rounds' medians, usec per collective"
  for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round" >&2
    for n in $SIZES; do
      if ((round % 2)); then
        add ami "$n" "$(run_ami "$n")"
        add mpi "$n" "$(run_mpi "$n")"
      else
        add mpi "$n" "$(run_mpi "$n")"
        add ami "$n" "$(run_ami "$n")"
      fi
    done
  done
  printf '%5s  %-16s %12s %12s  %8s   %-8s %s\n' procs collective "ami [usec]" "MPI [usec]" ami/MPI target ""
  for n in $SIZES; do
    local t8="" t1m=""
    ((n == 2)) && t8="<= 1.00" && t1m="<= 1.10"
    row "$n" barrier "barrier" "$t8"
    row "$n" allreduce_8 "allreduce 8 B" "$t8"
    row "$n" allreduce_1m "allreduce 1 MiB" "$t1m"
  done
  echo
  echo "# allreduce by size (sums of doubles), usec per allreduce, medians of the rounds"
  by_size
}

main() {
  check_mpi
  build
  mkdir -p "$OUT_DIR"
  rm -f "$OUT_DIR"/coll_vs_mpi_allreduce.{dat,png}
  report | tee "$OUT_DIR/coll_vs_mpi.txt"
  bench/plot.sh --pairs -t "allreduce (sums of doubles): ami vs Open MPI (btl self,vader)" \
    -y "latency [usec per allreduce]" "$OUT_DIR/coll_vs_mpi_allreduce.dat" "$OUT_DIR/coll_vs_mpi_allreduce.png" || true
}

main "$@"
