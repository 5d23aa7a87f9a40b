#!/usr/bin/env bash
# bench/multinode.sh — ami across two machines, in ONE boot of the two-node
# Slurm cluster of soft-RoCE VMs (tests/multinode/cluster.sh: node-a
# 10.56.0.1 and node-b 10.56.0.2, each a TCG VM with two vCPUs, one link).
#
#  1. Active messages: ami_send_lat (t_typical, usec) and ami_send_bw
#     (average, MiB/s) at SIZES between two tasks on the same node (shm)
#     and two tasks on different nodes (verbs over rxe). The tools run as
#     server and client (TCP bootstrap): the server started by srun on
#     node-a or node-b, the client on node-a; each side pinned to its own
#     vCPU (server 0, client 1). Ratio: two nodes / one node. Between the
#     nodes perftest's ib_send_lat and ib_send_bw (raw verbs SEND, the
#     tools' twins) run too, placed the same way. Ratio: ami / perftest.
#  2. Collectives at 4 tasks on 2 nodes, 2 per node (srun --mpi=pmix -N 2
#     -n 4 --ntasks-per-node=2): barrier, 8 B allreduce and 1 MiB allreduce
#     (sums of doubles), ami's bench/ami_coll_bench (its defaults: shm in a
#     node, verbs between them, PMIx bootstrap) against Open MPI's twin
#     bench/mpi_coll_bench.c, built here with mpicc. Open MPI gets its
#     transport from MPI_TRANSPORTS: ob1 (pml ob1, btl self,vader,tcp: shared
#     memory in a node, TCP between them) and ucx (pml ucx over rxe0, with
#     UCX's RC verbs and shared memory transports). Each is tried once with a
#     short run first; the report says which ran and why any other did not.
#     Ratio: ami / MPI, target <= 1.0.
#
# Everything runs interleaved, ROUNDS rounds (the order of the two sides
# swapped every round); the tables show the medians of the rounds and the
# ratios, which are what to read: absolute figures in TCG VMs sharing the
# host's cores move by tens of percent from run to run. The cluster writes
# its raw figures into a shared directory; the tables and plots are made
# back on the host. Written to OUT_DIR: multinode.txt (the report),
# multinode_am.dat/.png (latency and bandwidth by size, one node and two),
# multinode_verbs.dat/.png (between the nodes: ami and perftest by size),
# multinode_coll.dat/.png (allreduce at 8 B and 1 MiB, ami and each MPI).
# Needs root, qemu, Slurm and munge (as tests/multinode/cluster.sh), Open
# MPI (mpicc), perftest and gnuplot for the plots.
#
# usage: bench/multinode.sh [build-dir]
#        ROUNDS=5               rounds (at least 3)
#        SIZES="2 4096 65536 1048576"   active message sizes
#        MPI_TRANSPORTS="ob1 ucx"       Open MPI transports to try
#        COLL_ARGS="--iters 10 --large-iters 1 --reps 5"   both collective programs' arguments
#        TIMEOUT=900            the cluster's watchdog, seconds
#        NO_BUILD=1             measure the build directory as it is
#        OUT_DIR=<build-dir>/bench-results
set -euo pipefail
cd "$(dirname "$0")/.."

readonly NODE_A=10.56.0.1 NODE_B=10.56.0.2
RUN_TIMEOUT=120   # one program run in the cluster, seconds
PROBE_TIMEOUT=60  # the first short run of an Open MPI transport

# Iterations by test and size: enough for a median, few enough that a round
# over the emulated link takes about a minute.
iters_for() {  # iters_for lat|bw SIZE
  local test=$1 size=$2
  if [[ $test == lat ]]; then
    if ((size <= 4096)); then echo 100; elif ((size <= 65536)); then echo 50; else echo 20; fi
  else
    if ((size <= 4096)); then echo 2000; elif ((size <= 65536)); then echo 300; else echo 40; fi
  fi
}

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "n/a"; else print v[int((NR + 1) / 2)]}'; }

# ---- in the cluster, on node-a ---------------------------------------------

# Settings come from the host in RESULTS/settings; figures go to
# RESULTS/samples ("KEY VALUE" lines), notes for the report to RESULTS/notes.
in_cluster() {
  local results=$1 round where test size side
  # shellcheck disable=SC1091
  . "$results/settings"
  # Frames between the VMs are lost when a burst finds the receiving
  # guest busy, and rxe resends go-back-N without congestion control: as
  # tests/multinode/suite.sh, a longer RC ACK timeout (2^17 x 4.096 us)
  # and RDMA in pieces of 16 KiB, since rxe counts retries per work
  # request. srun passes the environment on.
  export AMI_VERBS_TIMEOUT=17 AMI_VERBS_MAX_RDMA=16384
  # The client may be up before srun has started the server on the other node.
  export AMI_BOOTSTRAP_TIMEOUT=60000
  samples=$results/samples notes=$results/notes
  log=$results/log
  port=21000
  : >"$samples"
  : >"$notes"
  : >"$log"

  local mpis=() t
  for t in $MPI_TRANSPORTS; do
    if mpi_probe "$t"; then mpis+=("$t"); fi
  done

  for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round of $ROUNDS" >&2
    local order=(same two perftest)
    ((round % 2)) || order=(perftest two same)
    for test in lat bw; do
      for size in $SIZES; do
        for where in "${order[@]}"; do
          if [[ $where == perftest ]]; then perftest_run "$test" "$size"; else am_run "$where" "$test" "$size"; fi
        done
      done
    done
    local sides=(ami "${mpis[@]/#/mpi-}")
    ((round % 2)) || sides=("${mpis[@]/#/mpi-}" ami)
    for side in "${sides[@]}"; do coll_run "$side"; done
  done
}

# am_run same|two lat|bw SIZE: one server/client pair; the client's figure
# goes to the samples as am/TEST/WHERE/SIZE.
am_run() {
  local where=$1 test=$2 size=$3 node host backend iters out server rc=0
  case $where in
    same) node=node-a host=$NODE_A backend=shm ;;
    two) node=node-b host=$NODE_B backend=verbs ;;
  esac
  iters=$(iters_for "$test" "$size")
  port=$((port + 1))
  local args=(--backend "$backend" -s "$size" -n "$iters" -p "$port")
  server=$results/server.out
  srun -N 1 -n 1 -w "$node" --mpi=none timeout "$RUN_TIMEOUT" taskset -c 0 \
    "$BUILD/tools/ami_send_$test" "${args[@]}" >"$server" 2>&1 &
  local spid=$!
  out=$(timeout "$RUN_TIMEOUT" taskset -c 1 "$BUILD/tools/ami_send_$test" "${args[@]}" "$host" 2>&1) || rc=$?
  wait "$spid" || rc=$?
  record "am/$test/$where/$size" "ami_send_$test $size B ($where)" "$rc" "$out" "$server"
}

# record KEY WHAT RC OUTPUT SERVER_FILE: the client's figure of a run (the
# row of its size in the layout ami's tools share with perftest) into the
# samples as KEY; a run that failed or printed no row goes to the log.
# Latency: t_typical. Bandwidth: the average in MiB/s (perftest's MB are
# 2^20 bytes too), or, below 10 MiB/s where that column keeps too few
# digits, from the message rate.
record() {
  local key=$1 what=$2 rc=$3 out=$4 server=$5 size value
  size=${key##*/}
  value=$(awk -v s="$size" -v t="${key#am/}" '$1 == s && NF >= 5 {
      if (t ~ /^lat/) print $5
      else if ($4 >= 10) print $4
      else printf "%.6g\n", $5 * 1e6 * s / 1048576 }' <<<"$out")
  if ((rc != 0)) || [[ -z $value ]]; then
    {
      echo "$what: exit $rc"
      tail -n 3 <<<"$out" | sed 's/^/  client: /'
      tail -n 3 "$server" | sed 's/^/  server: /'
    } | tee -a "$log" >&2
    return 0
  fi
  echo "$key $value" >>"$samples"
}

# perftest_run lat|bw SIZE: perftest's two-sided twin of ami_send_TEST
# (ib_send_lat or ib_send_bw: raw verbs SEND between the nodes), as am_run
# runs ami's over two nodes: server on node-b pinned to vCPU 0, client on
# node-a to vCPU 1, the same size and iterations, GID RXE_GID_INDEX. The
# client's figure goes to the samples as am/TEST/perftest/SIZE. perftest
# refuses to run when its clock calibration is noisy ("Correlation
# coefficient", common in a TCG VM): a run it refused is tried again, at
# most three times.
perftest_run() {
  local test=$1 size=$2 tool=ib_send_$1 iters out rc extra=() _
  iters=$(iters_for "$test" "$size")
  [[ $test == lat ]] && extra=(-F)  # no cpufreq in the VM: do not refuse over it
  for _ in 1 2 3; do
    port=$((port + 1))
    rc=0
    local args=(-d rxe0 -x "${RXE_GID_INDEX:-1}" -s "$size" -n "$iters" -p "$port" "${extra[@]}")
    srun -N 1 -n 1 -w node-b --mpi=none timeout "$RUN_TIMEOUT" taskset -c 0 \
      "$tool" "${args[@]}" >"$results/server.out" 2>&1 &
    local spid=$!
    # The server may not listen yet: perftest's client does not wait for it.
    local tries=0
    while :; do
      rc=0
      out=$(timeout "$RUN_TIMEOUT" taskset -c 1 "$tool" "${args[@]}" "$NODE_B" 2>&1) || rc=$?
      if ((rc != 0)) && grep -q "Couldn't connect" <<<"$out" && ((++tries < 60)); then sleep 0.5; else break; fi
    done
    wait "$spid" || true
    grep -q "Correlation coefficient" <<<"$out" || break
    echo "# $tool $size B refused over its clock calibration; again" >&2
  done
  record "am/$test/perftest/$size" "$tool $size B (two nodes)" "$rc" "$out" "$results/server.out"
}

# The environment that gives Open MPI its transport.
mpi_env() {  # mpi_env ob1|ucx -> NAME=VALUE words
  case $1 in
    ob1) echo "OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=eth0" ;;
    # UCX picks its transports on rxe0 (and shared memory in a node). Its
    # RC verbs need an auxiliary transport for their wire-up: UD verbs (UCX
    # 1.13 takes no TCP for that: "no auxiliary transport"). Where UD gets no
    # answer between the nodes (as between these VMs, in ucx_perftest too)
    # its endpoints give up after UCX's own timeout, 30 s, well inside the
    # probe, and the report quotes UCX's error rather than a bare timeout.
    ucx) echo "OMPI_MCA_pml=ucx OMPI_MCA_btl=self,vader OMPI_MCA_osc=^ucx UCX_NET_DEVICES=rxe0:1" \
              "UCX_IB_GID_INDEX=${RXE_GID_INDEX:-1} UCX_RC_TIMEOUT=2s" ;;
  esac
}

mpi_describe() {
  case $1 in
    ob1) echo "pml ob1, btl self,vader,tcp (shared memory in a node, TCP between nodes)" ;;
    ucx) echo "pml ucx on rxe0 (UCX's own choice of transports, shared memory in a node)" ;;
    *) echo "$1" ;;
  esac
}

# coll_job SIDE SECONDS ARGS...: the 4-task job, rank 0's lines on stdout.
coll_job() {
  local side=$1 seconds=$2 program=$BUILD/bench/ami_coll_bench
  shift 2
  local env=()
  if [[ $side == mpi-* ]]; then
    program=$BUILD/bench/mpi_coll_bench
    read -ra env <<<"$(mpi_env "${side#mpi-}")"
  fi
  env "${env[@]}" timeout -k 10 "$seconds" srun --mpi=pmix -N 2 -n 4 --ntasks-per-node=2 "$program" "$@"
}

# mpi_probe TRANSPORT: a short run; true when it gave all three figures.
mpi_probe() {
  local t=$1 out rc=0
  echo "# trying Open MPI with $(mpi_describe "$t")" >&2
  out=$(coll_job "mpi-$t" "$PROBE_TIMEOUT" --iters 5 --large-iters 1 --reps 1 2>"$results/probe.err") || rc=$?
  if ((rc == 0)) && (($(grep -cE '^(barrier|allreduce_8|allreduce_1m) [0-9]' <<<"$out") == 3)); then
    echo "mpi $t ok" >>"$notes"
    return 0
  fi
  local why
  why=$(grep -m 1 -E 'Fatal|[Ee]rror|failed|timed out|unreach' "$results/probe.err" | sed 's/^ *//' | cut -c1-160)
  ((rc == 124)) && why="no result within $PROBE_TIMEOUT s${why:+; $why}"
  echo "mpi $t failed: exit $rc: ${why:-no figures printed}" >>"$notes"
  { echo "Open MPI with $(mpi_describe "$t") failed (exit $rc):"; tail -n 20 "$results/probe.err"; } >>"$log"
  return 1
}

coll_run() {  # coll_run ami|mpi-TRANSPORT
  local side=$1 out rc=0 key value
  read -ra args <<<"$COLL_ARGS"
  out=$(coll_job "$side" "$RUN_TIMEOUT" "${args[@]}" 2>"$results/coll.err") || rc=$?
  if ((rc != 0)); then
    { echo "$side collectives: exit $rc"; tail -n 5 "$results/coll.err"; } | tee -a "$log" >&2
  fi
  while read -r key value; do
    if [[ $key =~ ^(barrier|allreduce_[0-9m]+)$ && $value =~ ^[0-9.]+$ ]]; then
      echo "coll/$side/$key $value" >>"$samples"
    fi
  done <<<"$out"
  return 0
}

# ---- on the host -------------------------------------------------------------

declare -A samples_of
load_samples() {
  local key value
  while read -r key value; do samples_of[$key]+="$value"$'\n'; done <"$1"
}
med() { printf '%s' "${samples_of[$1]:-}" | median; }
count() { printf '%s' "${samples_of[$1]:-}" | grep -c . || true; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.3f", a / b; else printf "n/a" }'; }

report() {
  local results=$1 test size one two t a m line
  local mpis=() failed=()
  while read -r line; do
    case $line in
      "mpi "*" ok") t=${line#mpi }; mpis+=("${t% ok}") ;;
      "mpi "*) failed+=("${line#mpi }") ;;
    esac
  done <"$results/notes"
  echo "# ami on two nodes: a two-node Slurm cluster of soft-RoCE VMs (TCG, 2 vCPUs each, one"
  echo "# emulated link), $ROUNDS interleaved rounds; every figure is the median of the rounds"
  echo "# (the number of rounds that gave one in [n] where fewer did)"
  echo
  echo "## active messages, two tasks: same node (shm) vs different nodes (verbs over rxe0)"
  echo "# ami_send_lat t_typical [usec], ami_send_bw average [MiB/s]; server started by srun on node-a or node-b, client on node-a"
  echo "# perftest: ib_send_lat / ib_send_bw (raw verbs SEND, ami_send_*'s twin) between the nodes, placed as ami's"
  printf '%-13s %8s %14s %14s %12s %14s %14s\n' test bytes "same node" "two nodes" "two/same" "perftest" "two/perftest"
  for test in lat bw; do
    for size in $SIZES; do
      one=$(med "am/$test/same/$size")
      two=$(med "am/$test/two/$size")
      pt=$(med "am/$test/perftest/$size")
      printf '%-13s %8s %14s %14s %12s %14s %14s\n' "send_$test" "$size" "$(annotate "$one" "am/$test/same/$size")" \
        "$(annotate "$two" "am/$test/two/$size")" "$(ratio "$two" "$one")" \
        "$(annotate "$pt" "am/$test/perftest/$size")" "$(ratio "$two" "$pt")"
    done
  done
  echo "# (latency: two/same above 1 is the cost of the network; bandwidth: below 1."
  echo "#  two/perftest: ami between the nodes against raw verbs on the same link)"
  echo
  echo "## collectives, 4 tasks on 2 nodes (srun --mpi=pmix -N 2 -n 4 --ntasks-per-node=2), usec per collective"
  echo "# ami: shm in a node, verbs over rxe0 between nodes; MPI: $(mpirun --version 2>/dev/null | head -1)"
  for t in "${mpis[@]}"; do echo "# MPI ($t): $(mpi_describe "$t")"; done
  for t in "${failed[@]}"; do echo "# MPI (${t%% *}) NOT MEASURED: $(mpi_describe "${t%% *}") ${t#* }"; done
  ((${#mpis[@]})) || echo "# no Open MPI transport ran across the two nodes: ami's figures alone"
  printf '%-16s %-5s %14s %14s %9s   %s\n' collective MPI "ami [usec]" "MPI [usec]" ami/MPI target
  for key in barrier allreduce_8 allreduce_1m; do
    a=$(med "coll/ami/$key")
    local label=${key/allreduce_8/allreduce 8 B}
    label=${label/allreduce_1m/allreduce 1 MiB}
    if ((${#mpis[@]} == 0)); then
      printf '%-16s %-5s %14s %14s %9s   %s\n' "$label" - "$(annotate "$a" "coll/ami/$key")" n/a n/a "<= 1.00"
    fi
    for t in "${mpis[@]}"; do
      m=$(med "coll/mpi-$t/$key")
      printf '%-16s %-5s %14s %14s %9s   %s\n' "$label" "$t" "$(annotate "$a" "coll/ami/$key")" \
        "$(annotate "$m" "coll/mpi-$t/$key")" "$(ratio "$a" "$m")" "<= 1.00"
    done
  done
  if [[ -s $results/log ]]; then
    echo
    echo "# failed runs (their rounds are left out of the medians):"
    sed 's/^/#   /' "$results/log"
  fi
}

annotate() {  # annotate VALUE KEY: VALUE, with [n] when fewer than ROUNDS rounds gave one
  local n
  n=$(count "$2")
  if [[ $1 == n/a ]] || ((n >= ROUNDS)); then echo "$1"; else echo "$1 [$n]"; fi
}

# am_dat COMMENT HEADER A B: by size, the medians of latency at A and B,
# then of bandwidth at A and B (WHERE of am/TEST/WHERE/SIZE), two pairs
# for bench/plot.sh --pairs.
am_dat() {
  local size
  echo "# $1"
  echo "$2"
  for size in $SIZES; do
    echo "$size $(med "am/lat/$3/$size") $(med "am/lat/$4/$size") $(med "am/bw/$3/$size") $(med "am/bw/$4/$size")"
  done
}

write_dats() {
  local results=$1 size t line
  am_dat "ami active messages, one node (shm) and two nodes (verbs over rxe0): send_lat t_typical [usec], send_bw average [MiB/s]" \
    "bytes lat_usec_one_node lat_usec_two_nodes bw_MiB/s_one_node bw_MiB/s_two_nodes" same two >"$OUT_DIR/multinode_am.dat"
  am_dat "between the nodes: ami_send_* (verbs over rxe0) and perftest's ib_send_*: t_typical [usec], average [MiB/s]" \
    "bytes ami_lat_usec ib_send_lat_usec ami_bw_MiB/s ib_send_bw_MiB/s" two perftest >"$OUT_DIR/multinode_verbs.dat"
  local mpis=()
  while read -r line; do
    if [[ $line == "mpi "*" ok" ]]; then t=${line#mpi }; mpis+=("${t% ok}"); fi
  done <"$results/notes"
  {
    echo "# allreduce (sums of doubles), 4 tasks on 2 nodes, usec; barrier: ami $(med coll/ami/barrier)$(
      for t in "${mpis[@]}"; do printf ', MPI %s %s' "$t" "$(med "coll/mpi-$t/barrier")"; done)"
    printf 'bytes ami'
    for t in "${mpis[@]}"; do printf ' MPI_%s' "$t"; done
    echo
    for size in 8 1048576; do
      local key=allreduce_8
      ((size == 8)) || key=allreduce_1m
      printf '%s %s' "$size" "$(med "coll/ami/$key")"
      for t in "${mpis[@]}"; do printf ' %s' "$(med "coll/mpi-$t/$key")"; done
      echo
    done
  } >"$OUT_DIR/multinode_coll.dat"
}

host_main() {
  BUILD=${1:-build}
  ROUNDS=${ROUNDS:-5}
  SIZES=${SIZES:-2 4096 65536 1048576}
  MPI_TRANSPORTS=${MPI_TRANSPORTS-ob1 ucx}
  COLL_ARGS=${COLL_ARGS:-"--iters 10 --large-iters 1 --reps 5"}
  TIMEOUT=${TIMEOUT:-900}
  NO_BUILD=${NO_BUILD:-0}
  OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
  local start=$SECONDS
  ((ROUNDS >= 3)) || { echo "ROUNDS must be at least 3" >&2; exit 2; }
  command -v mpicc >/dev/null || { echo "no mpicc: apt-get install -y libopenmpi-dev openmpi-bin" >&2; exit 1; }
  command -v ib_send_bw >/dev/null || { echo "no ib_send_bw: apt-get install -y perftest" >&2; exit 1; }
  # (mpicc can be there without the headers it compiles against)
  echo '#include <mpi.h>' | mpicc -E -x c - >/dev/null 2>&1 ||
    { echo "mpicc finds no mpi.h: apt-get install -y libopenmpi-dev" >&2; exit 1; }
  if [[ $NO_BUILD != 1 ]]; then
    [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
    meson compile -C "$BUILD" tools/ami_send_lat tools/ami_send_bw bench/ami_coll_bench >/dev/null
  fi
  local p
  for p in tools/ami_send_lat tools/ami_send_bw bench/ami_coll_bench; do
    [[ -x $BUILD/$p ]] || { echo "no $BUILD/$p" >&2; exit 1; }
  done
  mpicc -O2 -o "$BUILD/bench/mpi_coll_bench" bench/mpi_coll_bench.c
  BUILD=$(cd "$BUILD" && pwd)
  mkdir -p "$OUT_DIR"
  OUT_DIR=$(cd "$OUT_DIR" && pwd)
  rm -f "$OUT_DIR"/multinode{.txt,_am.dat,_am.png,_verbs.dat,_verbs.png,_coll.dat,_coll.png}

  local results rc=0
  results=$(mktemp -d)
  RESULTS_DIR=$results
  trap 'rm -rf "$RESULTS_DIR"' EXIT
  declare -p BUILD ROUNDS SIZES MPI_TRANSPORTS COLL_ARGS >"$results/settings"
  : >"$results/notes"
  : >"$results/samples"
  echo "# booting the two-node cluster; progress on stderr" >&2
  tests/multinode/cluster.sh --timeout "$TIMEOUT" --share "$PWD" --share "$BUILD" --share "$results" \
    -- "$PWD/bench/multinode.sh" --in-cluster "$results" >&2 || rc=$?
  ((rc == 77)) && { echo "SKIPPED: the two-node cluster cannot run here" >&2; exit 77; }
  ((rc == 0)) || echo "# the cluster ended with exit $rc: the figures are those measured until then" >&2

  load_samples "$results/samples"
  {
    report "$results"
    ((rc == 0)) || echo "# the cluster run ended with exit $rc before it was done (TIMEOUT=$TIMEOUT)"
    echo "# wall time: $((SECONDS - start)) s (build, cluster boot and all runs)"
  } | tee "$OUT_DIR/multinode.txt"
  write_dats "$results"
  bench/plot.sh --pairs -t "ami active messages: one node (shm) vs two nodes (verbs over rxe)" \
    -y "latency [usec], bandwidth [MiB/s]" "$OUT_DIR/multinode_am.dat" "$OUT_DIR/multinode_am.png" || true
  bench/plot.sh --pairs -t "between the nodes over rxe: ami vs perftest (ib_send_*)" \
    -y "latency [usec], bandwidth [MiB/s]" "$OUT_DIR/multinode_verbs.dat" "$OUT_DIR/multinode_verbs.png" || true
  bench/plot.sh -t "allreduce, 4 tasks on 2 nodes: ami vs Open MPI" -y "latency [usec per allreduce]" \
    "$OUT_DIR/multinode_coll.dat" "$OUT_DIR/multinode_coll.png" || true
  [[ -s $results/samples ]] || exit 1
  return "$rc"
}

if [[ ${1:-} == --in-cluster ]]; then
  in_cluster "$2"
else
  host_main "$@"
fi
