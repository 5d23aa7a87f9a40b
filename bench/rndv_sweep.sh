#!/usr/bin/env bash
# bench/rndv_sweep.sh — does the receiver's stop policy (AMI_RNDV_MODE=auto,
# nothing tuned) pick as well as the best fixed way of moving a long
# message, at every size? And how does it stand against UCX's sender
# threshold?
#
# For every size (8 B..16 MiB in powers of two, and a few odd sizes), active-
# message bandwidth (ami_send_bw) and latency (ami_send_lat) with
#   auto         the default: nothing set
#   eager        never stopped (AMI_RNDV_CROSSOVER=1 TiB, AMI_RNDV_LOW_WATER=100:
#                stopped only when the reception ring is full)
#   first        stopped at the first packet (AMI_RNDV_CROSSOVER=0: stop_put there)
#   discard_get, split_get, stop_put
#                stopped where auto stops, the rest moved that way (AMI_RNDV_MODE)
# and, on shared memory, UCX's active messages side by side (ucx_perftest
# ucp_am_bw / ucp_am_lat, UCX_TLS=sm): its default thresholds, and
# UCX_RNDV_THRESH forced low (0: rendezvous always) and high (inf: never).
# With --rxe, the same ami runs in one boot of the soft-RoCE VM
# (tests/rxe/ami-vm), next to perftest's ib_send_bw / ib_send_lat.
#
# Server on core 0, client on core 1 (ami's --local pins them so; UCX by
# taskset). A round runs every size, and at each size every system one
# after the other (the modes in an order each round rotates); ROUNDS
# rounds. The .dat tables and plots hold medians over the rounds; the
# verdict table below uses best rounds and medians of each round's ratio
# (its runs lie seconds apart, so load that comes and goes touches both
# sides of a ratio alike).
# Bandwidth: MiB/s, average (ami's "BW average", UCX's "overall").
# Latency: usec, one way (ami's t_typical, UCX's 50%ile, perftest's t_typical).
#
# Per size the table gives auto's and the best fixed mode's (eager, first,
# discard_get, split_get, stop_put) best round, auto/best over those best
# rounds (what each policy can do: load only ever slows a run, and on a
# shared machine a mode's median can fall in a slow spell that another's
# misses, even where both run the same code), the median of the rounds'
# auto/best ratios beside it, and auto/UCX (auto/perftest on rxe) as a
# median of the rounds' ratios.
# Every ratio reads "higher is better for auto": bandwidth auto/other,
# latency other/auto. Targets: auto/best >= 0.95 at every size; on shm,
# bandwidth auto/UCX >= 1.00 from 64 KiB up (auto/perftest on rxe is for
# reference). A "<" marks a miss. Sizes the tools refuse (above their
# largest, -s) are left out of ami's columns ("-").
#
# Written to OUT_DIR: rndv_sweep_<where>.txt (everything printed),
# rndv_sweep_<where>.raw (every run's figure: test, system, size, round, value),
# rndv_sweep_<where>_bw.dat, rndv_sweep_<where>_lat.dat (the medians: a
# header row, then one row per size, one column per mode or system; what
# bench/plot.sh draws) and their .png, <where> being shm or rxe.
#
# usage: bench/rndv_sweep.sh [--rxe] [build-dir]
#        ROUNDS=5 (rxe: 3)
#        SIZES="8 16 ... 16777216 300 9000 40000 1500000"
#        LAT_BYTES=1073741824 (rxe: 16777216)  bytes each way per latency run
#        BW_BYTES=2147483648 (rxe: 33554432)   bytes per bandwidth run
#        LAT_ITERS=20000 (rxe: 1000)  MAX_ITERS=1000000 (rxe: 5000)  iterations at most
#        MIN_ITERS=100 (rxe: 10)      iterations at least
#        OUT_DIR=<build-dir>/bench-results
set -euo pipefail
cd "$(dirname "$0")/.."

RXE=0
if [[ ${1:-} == --rxe ]]; then
  RXE=1
  shift
fi
BUILD=${1:-build}
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
PORT=${PORT:-19300}
DEFAULT_SIZES="8 16 32 64 128 256 300 512 1024 2048 4096 8192 9000 16384 32768 40000 65536 131072 262144 524288
  1048576 1500000 2097152 4194304 8388608 16777216"
if ((RXE)); then
  ROUNDS=${ROUNDS:-3} LAT_ITERS=${LAT_ITERS:-1000} LAT_BYTES=${LAT_BYTES:-16777216}
  BW_BYTES=${BW_BYTES:-33554432} MIN_ITERS=${MIN_ITERS:-10} MAX_ITERS=${MAX_ITERS:-5000}
else
  ROUNDS=${ROUNDS:-5} LAT_ITERS=${LAT_ITERS:-20000} LAT_BYTES=${LAT_BYTES:-1073741824}
  BW_BYTES=${BW_BYTES:-2147483648} MIN_ITERS=${MIN_ITERS:-100} MAX_ITERS=${MAX_ITERS:-1000000}
fi
SIZES=$(printf '%s\n' ${SIZES:-$DEFAULT_SIZES} | sort -n -u | tr '\n' ' ')
RUN_TIMEOUT=${RUN_TIMEOUT:-300}

# The modes: name and the environment that makes it ("-": none). The first
# is auto; the others are the fixed modes it is held against.
readonly MODES=(
  "auto        -"
  "eager       AMI_RNDV_CROSSOVER=1099511627776 AMI_RNDV_LOW_WATER=100"
  "first       AMI_RNDV_CROSSOVER=0"
  "discard_get AMI_RNDV_MODE=discard_get"
  "split_get   AMI_RNDV_MODE=split_get"
  "stop_put    AMI_RNDV_MODE=stop_put"
)
# The reference systems: name, and for UCX its environment.
readonly UCX_PEERS=(
  "ucx           UCX_TLS=sm"
  "ucx_rndv_low  UCX_TLS=sm UCX_RNDV_THRESH=0"
  "ucx_rndv_high UCX_TLS=sm UCX_RNDV_THRESH=inf"
)
# No tuning: auto is what a user gets with nothing set.
unset AMI_RNDV_MODE AMI_RNDV_CROSSOVER AMI_RNDV_LOW_WATER

mode_names() { local m; for m in "${MODES[@]}"; do echo "${m%% *}"; done; }
# The modes in the order round R runs them: rotated by R, so that no mode
# always runs first after a size change (or after the peers).
round_modes() { mode_names | awk -v r="$1" '{m[NR - 1] = $0} END {for (i = 0; i < NR; i++) print m[(i + r) % NR]}'; }
mode_env() {
  local m
  for m in "${MODES[@]}"; do
    [[ ${m%% *} == "$1" ]] || continue
    m=$(sed 's/^[^ ]* *//' <<<"$m")
    [[ $m == - ]] || echo "$m"
  done
}

# Iterations at SIZE: a latency run moves LAT_BYTES each way, a bandwidth
# run BW_BYTES (long enough that a run is not one scheduler tick), within
# [MIN_ITERS, LAT_ITERS] and [MIN_ITERS, MAX_ITERS].
lat_iters() {
  awk -v b="$LAT_BYTES" -v n="$LAT_ITERS" -v lo="$MIN_ITERS" -v s="$1" \
    'BEGIN { m = int(b / s); if (m > n) m = n; if (m < lo) m = lo; print m }'
}
bw_iters() {
  awk -v b="$BW_BYTES" -v lo="$MIN_ITERS" -v hi="$MAX_ITERS" -v s="$1" \
    'BEGIN { m = int(b / s); if (m > hi) m = hi; if (m < lo) m = lo; print m }'
}

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)]}'; }

# samples[TEST/SYSTEM/SIZE]: one line per round, "ROUND VALUE".
declare -A samples
add() {  # add TEST SYSTEM SIZE ROUND VALUE (an empty or non-numeric VALUE is left out)
  [[ $5 =~ ^[0-9.eE+-]+$ ]] && samples[$1/$2/$3]+="$4 $5"$'\n'
  return 0
}

# The largest size the ami tools take (-s): larger ones are left out.
max_tool_size() {
  local s=1
  while "$BUILD/tools/ami_send_bw" -s $((s * 2)) -h >/dev/null 2>&1 && ((s < (1 << 40))); do s=$((s * 2)); done
  echo "$s"
}

# The last run's results as JSON (--out_json): its latency has every digit,
# where the printed table rounds to 10 ns.
JSON=/tmp/rndv-sweep-$$.json
trap 'rm -f "$JSON"' EXIT

# ami TOOL MODE SIZE ITERS [DEVICE-ARGS...] -> the tool's result row
ami() {
  local tool=$1 mode=$2 size=$3 iters=$4 out envs
  shift 4
  read -ra envs <<<"$(mode_env "$mode")"
  rm -f "$JSON"
  out=$(env "${envs[@]}" timeout "$RUN_TIMEOUT" "$BUILD/tools/$tool" --local "$@" -s "$size" -n "$iters" \
          --out_json --out_json_file="$JSON" 2>&1) ||
    echo "$tool ($mode) -s $size failed: $(tail -2 <<<"$out")" >&2
  awk -v s="$size" '$1 == s' <<<"$out"
}

# ami_figure TEST < row: bandwidth average [MiB/s] (the row's), or t_typical
# [usec] (the JSON's; none when the run printed no row)
ami_figure() {
  if [[ $1 == bw ]]; then
    awk '{print $4}'
  elif [[ -n $(cat) && -f $JSON ]]; then
    awk -F: '/"t_typical"/ { gsub(/[ ,]/, "", $2); printf "%.4f\n", $2 }' "$JSON"
  fi
}

# ---- shared memory ----------------------------------------------------------

SERVER_CPU=0
CLIENT_CPU=$(($(nproc) > 1 ? 1 : 0))

# pair SERVER-CMD... -- CLIENT-CMD...: both pinned; prints the client's output.
pair() {
  local server=() client=() spid out
  while [[ $1 != -- ]]; do server+=("$1"); shift; done
  shift
  client=("$@")
  timeout "$RUN_TIMEOUT" taskset -c "$SERVER_CPU" "${server[@]}" >/dev/null 2>&1 &
  spid=$!
  sleep 0.3
  out=$(timeout "$RUN_TIMEOUT" taskset -c "$CLIENT_CPU" "${client[@]}" 2>&1) || true
  wait "$spid" 2>/dev/null || true
  PORT=$((PORT + 1))
  printf '%s\n' "$out"
}

# ucx NAME TEST SIZE ITERS -> the figure from ucx_perftest's Final line
# (ucp_am_bw: overall MB/s, which UCX counts in MiB; ucp_am_lat: 50%ile usec)
ucx() {
  local name=$1 test=$2 size=$3 iters=$4 spec envs=() column=3
  for spec in "${UCX_PEERS[@]}"; do [[ ${spec%% *} == "$name" ]] && read -ra envs <<<"${spec#* }"; done
  [[ $test == ucp_am_bw ]] && column=7
  (
    export "${envs[@]}"
    pair ucx_perftest -t "$test" -s "$size" -n "$iters" -p "$PORT" -- \
      ucx_perftest 127.0.0.1 -t "$test" -s "$size" -n "$iters" -p "$PORT"
  ) | awk -v c="$column" '$1 == "Final:" {print $c}'
  PORT=$((PORT + 1))
}

shm_round() {
  local r=$1 size mode name spec li bi
  for size in $SIZES; do
    li=$(lat_iters "$size") bi=$(bw_iters "$size")
    for mode in $(round_modes "$r"); do
      ((size > TOOL_MAX)) && continue
      add bw "$mode" "$size" "$r" "$(ami ami_send_bw "$mode" "$size" "$bi" | ami_figure bw)"
      add lat "$mode" "$size" "$r" "$(ami ami_send_lat "$mode" "$size" "$li" | ami_figure lat)"
    done
    for spec in "${UCX_PEERS[@]}"; do
      name=${spec%% *}
      add bw "$name" "$size" "$r" "$(ucx "$name" ucp_am_bw "$size" "$bi")"
      add lat "$name" "$size" "$r" "$(ucx "$name" ucp_am_lat "$size" "$li")"
    done
  done
}

# ---- soft-RoCE (in the VM) --------------------------------------------------

# perftest TOOL SIZE ITERS -> its figure (bandwidth average from the message
# rate column, in MiB/s, as bench/rxe_vs_perftest.sh reads it; t_typical)
perftest() {
  local tool=$1 size=$2 iters=$3 extra=() out=/tmp/rndv-sweep-perftest
  [[ $tool == *_lat ]] && extra=(-F)  # no cpufreq in the VM: do not refuse over it
  perftest_pair "$out" "$PORT" "$RUN_TIMEOUT" "$tool" -d "$DEVICE" -x "$RXE_GID_INDEX" -s "$size" \
    -n "$iters" "${extra[@]}" || echo "$tool -s $size failed: $(tail -1 "$out.client")" >&2
  PORT=$((PORT + 6))
  if [[ $tool == *_lat ]]; then
    awk -v s="$size" '$1 == s {print $5}' "$out.client"
  else
    awk -v s="$size" '$1 == s {printf "%.6g\n", $5 * 1e6 * s / 1048576}' "$out.client"
  fi
}

rxe_round() {
  local r=$1 size mode li bi dev=(-d "$DEVICE" -x "$RXE_GID_INDEX")
  for size in $SIZES; do
    li=$(lat_iters "$size") bi=$(bw_iters "$size")
    for mode in $(round_modes "$r"); do
      ((size > TOOL_MAX)) && continue
      add bw "$mode" "$size" "$r" "$(AMI_VERBS_CM=off ami ami_send_bw "$mode" "$size" "$bi" "${dev[@]}" | ami_figure bw)"
      add lat "$mode" "$size" "$r" "$(AMI_VERBS_CM=off ami ami_send_lat "$mode" "$size" "$li" "${dev[@]}" | ami_figure lat)"
    done
    add bw perftest "$size" "$r" "$(perftest ib_send_bw "$size" "$bi")"
    add lat perftest "$size" "$r" "$(perftest ib_send_lat "$size" "$li")"
  done
}

# ---- the tables -------------------------------------------------------------

# value TEST SYSTEM SIZE: the median over the rounds ("nan": none)
value() { printf '%s' "${samples[$1/$2/$3]:-}" | awk '{print $2}' | median; }

# peak TEST SYSTEM SIZE: the best round (bandwidth: the highest, latency:
# the lowest). Load on the machine only ever slows a run down, so the best
# round is what a mode can do; the median is what it did.
peak() {
  printf '%s' "${samples[$1/$2/$3]:-}" | awk '{print $2}' | sort -g |
    if [[ $1 == lat ]]; then head -1; else tail -1; fi | awk 'END { print NR ? $1 : "nan" }'
}

# ratio TEST A B SIZE: the median of the rounds' ratios, "higher is better
# for A" (bandwidth A/B, latency B/A); "nan" when no round has both
ratio() {
  local test=$1 a=$2 b=$3 size=$4
  { printf '%s' "${samples[$test/$a/$size]:-}" | sed 's/^/a /'
    printf '%s' "${samples[$test/$b/$size]:-}" | sed 's/^/b /'; } |
    awk -v lat="$([[ $test == lat ]] && echo 1 || echo 0)" '
      { v[$1, $2] = $3; r[$2] = 1 }
      END { for (k in r) if (((("a", k) in v) && (("b", k) in v)) && v["a", k] > 0 && v["b", k] > 0)
              print lat ? v["b", k] / v["a", k] : v["a", k] / v["b", k] }' | median
}

# table TEST DAT PEER_TARGET PEER...: prints the medians with the verdict
# columns, and writes the medians (header row, one row per size) to DAT.
# PEER_TARGET 1: bandwidth against the first peer has a target (>= 1.00
# from 64 KiB up).
table() {
  local test=$1 dat=$2 peer_target=$3 size mode best bv v r rp peer fixed
  shift 3
  local peers=("$@") columns=()
  read -ra columns <<<"$(mode_names | tr '\n' ' ')"  # (no process substitution: the VM has no /dev/fd)
  columns+=("${peers[@]}")
  fixed=("${columns[@]:1:${#MODES[@]}-1}")
  {
    printf '%-9s' bytes
    for mode in "${columns[@]}"; do printf ' %13s' "$mode"; done
    echo
    for size in $SIZES; do
      printf '%-9s' "$size"
      for mode in "${columns[@]}"; do printf ' %13s' "$(value "$test" "$mode" "$size")"; done
      echo
    done
  } >"$dat"
  printf '%-9s %13s %13s %-12s %9s %9s %9s\n' bytes auto best_fixed "(mode)" auto/best median auto/${peers[0]}
  for size in $SIZES; do
    best="" bv=""
    for mode in "${fixed[@]}"; do
      v=$(peak "$test" "$mode" "$size")
      [[ $v == nan ]] && continue
      if [[ -z $best ]] || awk -v v="$v" -v b="$bv" -v lat="$([[ $test == lat ]] && echo 1 || echo 0)" \
           'BEGIN { exit !(lat ? v < b : v > b) }'; then
        best=$mode bv=$v
      fi
    done
    v=$(peak "$test" auto "$size")
    r=nan rm=nan rp=$(ratio "$test" auto "${peers[0]}" "$size")
    if [[ -n $best ]]; then
      rm=$(ratio "$test" auto "$best" "$size")
      r=$(awk -v a="$v" -v b="$bv" -v lat="$([[ $test == lat ]] && echo 1 || echo 0)" \
            'BEGIN { if (a == "nan" || a <= 0 || b <= 0) print "nan"; else print lat ? b / a : a / b }')
    fi
    awk -v s="$size" -v a="$v" -v b="${bv:-nan}" -v m="${best:--}" -v r="$r" -v rm="$rm" -v p="$rp" \
        -v bw="$([[ $test == bw && $peer_target == 1 ]] && echo 1 || echo 0)" '
      function f(x) { return x == "nan" ? "-" : sprintf("%.3f", x) }
      BEGIN {
        miss = (r != "nan" && r < 0.95) ? "<" : " "
        pmiss = (bw && s >= 65536 && p != "nan" && p < 1.0) ? "<" : " "
        printf "%-9s %13s %13s %-12s %8s%s %9s %8s%s\n", s, a, b, m, f(r), miss, f(rm), f(p), pmiss
      }'
  done
}

report() {
  local where=$1 r
  shift
  local peers=("$@")
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "# round $r of $ROUNDS" >&2
    if [[ $where == rxe ]]; then rxe_round "$r"; else shm_round "$r"; fi
  done
  local k
  for k in "${!samples[@]}"; do printf '%s' "${samples[$k]}" | sed "s|^|${k//\//\ } |"; done |
    sort -k1,1 -k2,2 -k3,3n -k4,4n >"$OUT_DIR/rndv_sweep_${where}.raw"  # test system size round value
  echo
  local peer_target=1
  [[ $where == rxe ]] && peer_target=0
  echo "# bandwidth [MiB/s]: auto and best_fixed are best rounds of $ROUNDS interleaved ones; auto/best of"
  echo "# those, median: of the rounds' ratios, auto/${peers[0]}: median of the rounds' ratios (auto/other)"
  table bw "$OUT_DIR/rndv_sweep_${where}_bw.dat" "$peer_target" "${peers[@]}"
  echo
  echo "# the medians by mode and system (bandwidth [MiB/s])"
  cat "$OUT_DIR/rndv_sweep_${where}_bw.dat"
  echo
  echo "# latency [usec]: auto and best_fixed are best rounds of $ROUNDS interleaved ones; auto/best of"
  echo "# those, median: of the rounds' ratios, auto/${peers[0]}: median of the rounds' ratios (other/auto)"
  table lat "$OUT_DIR/rndv_sweep_${where}_lat.dat" 0 "${peers[@]}"
  echo
  echo "# the medians by mode and system (latency [usec])"
  cat "$OUT_DIR/rndv_sweep_${where}_lat.dat"
  echo
  if ((peer_target)); then
    echo "# targets: auto/best >= 0.95 at every size; bandwidth auto/${peers[0]} >= 1.00 from 65536 B up;"
  else
    echo "# target: auto/best >= 0.95 at every size (auto/${peers[0]} is for reference);"
  fi
  echo "# '<' marks a miss"
}

plots() {
  local where=$1 what=$2
  bench/plot.sh -t "$what: active-message bandwidth by rendezvous mode" -y "bandwidth [MiB/s]" \
    "$OUT_DIR/rndv_sweep_${where}_bw.dat" "$OUT_DIR/rndv_sweep_${where}_bw.png" || true
  bench/plot.sh -t "$what: active-message latency by rendezvous mode" -y "latency [usec]" \
    "$OUT_DIR/rndv_sweep_${where}_lat.dat" "$OUT_DIR/rndv_sweep_${where}_lat.png" || true
}

ensure_build() {
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" --buildtype=release >/dev/null
  meson compile -C "$BUILD" tools/ami_info tools/ami_send_bw tools/ami_send_lat >/dev/null
}

shm_main() {
  command -v ucx_perftest >/dev/null || { echo "rndv_sweep: needs ucx_perftest (Debian: ucx-utils)" >&2; exit 1; }
  ensure_build
  mkdir -p "$OUT_DIR"
  rm -f "$OUT_DIR"/rndv_sweep_shm_{bw,lat}.{dat,png}
  TOOL_MAX=$(max_tool_size)
  local peers=()
  for spec in "${UCX_PEERS[@]}"; do peers+=("${spec%% *}"); done
  {
    echo "# rndv sweep on shared memory: ami (auto vs fixed modes) and UCX active messages (UCX_TLS=sm)"
    echo "# server on core $SERVER_CPU, client on core $CLIENT_CPU; $("$BUILD/tools/ami_info" | head -1 | sed 's/^# //')"
    ((TOOL_MAX >= 16777216)) || echo "# the ami tools take sizes up to $TOOL_MAX B: larger ones have no ami figures"
    report shm "${peers[@]}"
  } | tee "$OUT_DIR/rndv_sweep_shm.txt"
  plots shm "shared memory"
}

rxe_host_main() {
  ensure_build
  mkdir -p "$OUT_DIR"
  rm -f "$OUT_DIR"/rndv_sweep_rxe_{bw,lat}.{dat,png}
  local build out rc=0
  build=$(cd "$BUILD" && pwd)
  out=$(cd "$OUT_DIR" && pwd)
  # The VM passes only AMI_* variables on: the settings go as arguments.
  tests/rxe/ami-vm --timeout 20000 --share "$PWD" --share "$build" --share "$out" -- \
    "$PWD/bench/rndv_sweep.sh" --in-vm "$build" "$out" "$ROUNDS" "$LAT_ITERS" "$LAT_BYTES" "$BW_BYTES" \
    "$MIN_ITERS" "$MAX_ITERS" "$SIZES" | tee "$OUT_DIR/rndv_sweep_rxe.txt" || rc=$?
  plots rxe "soft-RoCE (rxe0)"
  return "$rc"
}

rxe_vm_main() {
  BUILD=$1 OUT_DIR=$2 ROUNDS=$3 LAT_ITERS=$4 LAT_BYTES=$5 BW_BYTES=$6 MIN_ITERS=$7 MAX_ITERS=$8 SIZES=$9
  DEVICE=${AMI_NET_DEVICES:-rxe0:1}
  DEVICE=${DEVICE%%:*}
  . tests/rxe/perftest_pair.sh
  TOOL_MAX=$(max_tool_size)
  echo "# rndv sweep on $DEVICE (soft-RoCE in a TCG VM), GID index $RXE_GID_INDEX: ami (auto vs fixed modes)"
  echo "# and perftest (ib_send_bw average, ib_send_lat t_typical); $("$BUILD/tools/ami_info" | head -1 | sed 's/^# //')"
  ((TOOL_MAX >= 16777216)) || echo "# the ami tools take sizes up to $TOOL_MAX B: larger ones have no ami figures"
  report rxe perftest
}

main() {
  if [[ ${1:-} == --in-vm ]]; then
    shift
    [[ ${RXE_VM:-} == 1 ]] || { echo "rndv_sweep: --in-vm is for the soft-RoCE VM" >&2; exit 2; }
    rxe_vm_main "$@"
  elif ((RXE)); then
    rxe_host_main
  else
    shm_main
  fi
}

# One line that bash has read whole before the run starts: a sweep takes an
# hour, and bash reads a script as it goes, so an edit of this file during a
# run must find nothing left to read.
main "$@"; exit $?
