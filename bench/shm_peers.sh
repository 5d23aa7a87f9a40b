#!/usr/bin/env bash
# bench/shm_peers.sh — ami's shared-memory backend side by side with UCX
# (ucx_perftest, UCX_TLS=sm) and libfabric (fi_pingpong -p shm), in one run,
# server pinned to core 0 and client to core 1. Each figure is the median of
# ROUNDS interleaved runs; the ratio ami/peer is what to read, since absolute
# numbers move with the machine's load.
#
# Then, in the same rounds, a sweep over SIZES: active-message latency
# (ami_send_lat, ucx ucp_am_lat, fi_pingpong) and bandwidth (ami_send_bw,
# ami_write_bw, ami_read_bw against ucp_am_bw, ucp_put_bw, ucp_get), printed
# as two more tables and drawn by bench/plot.sh against message size. The
# tables and plots are written to OUT_DIR: shm_peers.txt (everything
# printed), shm_peers_lat.dat/.png, shm_peers_bw.dat/.png.
#
# usage: bench/shm_peers.sh [build-dir]
#        ROUNDS=3                       rounds
#        LAT_ITERS RATE_ITERS BW_ITERS  iterations of the 8 B and 1 MiB figures
#        SIZES="8 64 ... 1048576"       the sweep's sizes ("" leaves it out)
#        SWEEP_BYTES=268435456          bytes per bandwidth run of the sweep
#        OUT_DIR=<build-dir>/bench-results
#        BASELINE=<build-dir>           another build of ami (an earlier tree):
#                                       its tools run in the same rounds, next
#                                       to this build's, and a last table gives
#                                       this/baseline for every ami figure
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-3}
LAT_ITERS=${LAT_ITERS:-20000}
RATE_ITERS=${RATE_ITERS:-200000}
BW_ITERS=${BW_ITERS:-2000}
SIZES=${SIZES-8 64 512 4096 32768 262144 1048576}
SWEEP_BYTES=${SWEEP_BYTES:-268435456}
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
BASELINE=${BASELINE:-}
PORT=${PORT:-19000}
SERVER_CPU=0
CLIENT_CPU=$(( $(nproc) > 1 ? 1 : 0 ))

ensure_packages() {
  local missing=()
  command -v ucx_perftest >/dev/null || missing+=(ucx-utils)
  command -v fi_pingpong >/dev/null || missing+=(libfabric-bin)
  ((${#missing[@]})) || return 0
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  echo "installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_build() {  # ensure_build DIR
  [[ -f "$1/build.ninja" ]] || meson setup "$1" >/dev/null
  meson compile -C "$1" tools/ami_info tools/ami_send_lat tools/ami_send_bw tools/ami_write_bw \
    tools/ami_read_bw >/dev/null
}

# pair SERVER-CMD... -- CLIENT-CMD...: runs both pinned, prints the client's output.
pair() {
  local server=() client=()
  while [[ $1 != -- ]]; do server+=("$1"); shift; done
  shift
  client=("$@")
  taskset -c "$SERVER_CPU" "${server[@]}" >/dev/null 2>&1 &
  local spid=$!
  sleep 0.3
  local out
  out=$(timeout 120 taskset -c "$CLIENT_CPU" "${client[@]}" 2>&1) || true
  wait "$spid" 2>/dev/null || true
  PORT=$((PORT + 1))
  printf '%s\n' "$out"
}

ami() {  # ami TOOL SIZE ITERS [BUILD] -> the tool's result row
  local tool=$1 size=$2 iters=$3 build=${4:-$BUILD}
  pair "$build/tools/$tool" -s "$size" -n "$iters" -p "$PORT" -- \
       "$build/tools/$tool" -s "$size" -n "$iters" -p "$PORT" 127.0.0.1 | awk -v s="$size" '$1 == s'
}

# base KEY TOOL SIZE ITERS COLUMN: with a BASELINE, the same figure from its
# tools, under base_KEY.
base() {
  [[ -n $BASELINE ]] || return 0
  add "base_$1" "$(ami "$2" "$3" "$4" "$BASELINE" | awk -v c="$5" '{print (c == "rate") ? $5 * 1e6 : $c}')"
}

ucx() {  # ucx TEST SIZE ITERS -> ucx_perftest's Final line
  local test=$1 size=$2 iters=$3
  UCX_TLS=sm pair ucx_perftest -t "$test" -s "$size" -n "$iters" -p "$PORT" -- \
       ucx_perftest 127.0.0.1 -t "$test" -s "$size" -n "$iters" -p "$PORT" | grep '^Final:'
}

fabric() {  # fabric SIZE ITERS -> fi_pingpong's result row (the one after its header: it
            # prints sizes as 1k, 1m)
  local size=$1 iters=$2
  pair fi_pingpong -p shm -e rdm -S "$size" -I "$iters" -B "$PORT" -- \
       fi_pingpong -p shm -e rdm -S "$size" -I "$iters" -P "$PORT" 127.0.0.1 | awk 'row { print; exit } $1 == "bytes" { row = 1 }'
}

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)]}'; }

declare -A samples
add() { samples[$1]+="$2"$'\n'; }

# Iterations of the sweep at SIZE: latency runs LAT_ITERS up to 512 B and
# fewer above (at least 200); bandwidth runs move SWEEP_BYTES (at least 200
# and at most RATE_ITERS messages).
lat_iters() { awk -v n="$LAT_ITERS" -v s="$1" 'BEGIN { m = int(n * 512 / s); if (m > n) m = n; if (m < 200) m = 200; print m }'; }
bw_iters() { awk -v b="$SWEEP_BYTES" -v r="$RATE_ITERS" -v s="$1" 'BEGIN { m = int(b / s); if (m > r) m = r; if (m < 200) m = 200; print m }'; }

# The sweep: for each size, each figure into samples[KEY/SIZE].
sweep_round() {
  local size li bi
  for size in $SIZES; do
    li=$(lat_iters "$size") bi=$(bw_iters "$size")
    add "lat_ami/$size"  "$(ami ami_send_lat "$size" "$li" | awk '{print $5}')"    # t_typical [usec]
    add "lat_ucx/$size"  "$(ucx ucp_am_lat "$size" "$li" | awk '{print $3}')"      # 50%ile [usec]
    add "lat_fi/$size"   "$(fabric "$size" "$li" | awk '{print $7}')"               # usec/xfer
    add "bw_ami/$size"   "$(ami ami_send_bw "$size" "$bi" | awk '{print $4}')"      # MiB/s
    add "bw_ucx/$size"   "$(ucx ucp_am_bw "$size" "$bi" | awk '{print $7}')"
    add "put_ami/$size"  "$(ami ami_write_bw "$size" "$bi" | awk '{print $4}')"
    add "put_ucx/$size"  "$(ucx ucp_put_bw "$size" "$bi" | awk '{print $7}')"
    add "get_ami/$size"  "$(ami ami_read_bw "$size" "$bi" | awk '{print $4}')"
    add "get_ucx/$size"  "$(ucx ucp_get "$size" "$bi" | awk '{print $7}')"
    base "lat_ami/$size" ami_send_lat "$size" "$li" 5
    base "bw_ami/$size" ami_send_bw "$size" "$bi" 4
    base "put_ami/$size" ami_write_bw "$size" "$bi" 4
    base "get_ami/$size" ami_read_bw "$size" "$bi" 4
  done
}

# sweep_table FILE KEY:NAME...: the medians by size, one column per key,
# printed and written to FILE (bench/plot.sh's input).
sweep_table() {
  local file=$1 size spec
  shift
  {
    printf '%-10s' bytes
    for spec in "$@"; do printf ' %14s' "${spec#*:}"; done
    echo
    for size in $SIZES; do
      printf '%-10s' "$size"
      for spec in "$@"; do
        printf ' %14s' "$(printf '%s' "${samples[${spec%%:*}/$size]:-}" | grep . | median)"
      done
      echo
    done
  } | tee "$file"
}

one_round() {
  add ami_lat8   "$(ami ami_send_lat 8 "$LAT_ITERS" | awk '{print $5}')"            # t_typical
  add ucx_lat8   "$(ucx ucp_am_lat 8 "$LAT_ITERS" | awk '{print $3}')"              # 50%ile
  add fi_lat8    "$(fabric 8 "$LAT_ITERS" | awk '{print $7}')"                      # usec/xfer
  add ami_rate8  "$(ami ami_send_bw 8 "$RATE_ITERS" | awk '{print $5 * 1e6}')"      # msg/s
  add ucx_rate8  "$(ucx ucp_am_bw 8 "$RATE_ITERS" | awk '{print $9}')"
  add ami_bw1m   "$(ami ami_send_bw 1048576 "$BW_ITERS" | awk '{print $4}')"        # MiB/s
  add ucx_bw1m   "$(ucx ucp_am_bw 1048576 "$BW_ITERS" | awk '{print $7}')"
  add ami_put1m  "$(ami ami_write_bw 1048576 "$BW_ITERS" | awk '{print $4}')"
  add ucx_put1m  "$(ucx ucp_put_bw 1048576 "$BW_ITERS" | awk '{print $7}')"
  add ami_get1m  "$(ami ami_read_bw 1048576 "$BW_ITERS" | awk '{print $4}')"
  add ucx_get1m  "$(ucx ucp_get 1048576 "$BW_ITERS" | awk '{print $7}')"
  base ami_lat8 ami_send_lat 8 "$LAT_ITERS" 5
  base ami_rate8 ami_send_bw 8 "$RATE_ITERS" rate
  base ami_bw1m ami_send_bw 1048576 "$BW_ITERS" 4
  base ami_put1m ami_write_bw 1048576 "$BW_ITERS" 4
  base ami_get1m ami_read_bw 1048576 "$BW_ITERS" 4
}

# baseline_table: this build against BASELINE, every ami figure: both
# medians and this/baseline ("higher is better": latency baseline/this).
baseline_table() {
  local key label lower a b size
  echo "# this build against the baseline ($BASELINE), same rounds; ratio: higher is better for this build"
  printf '%-34s %14s %14s %9s\n' figure this baseline ratio
  local figures=("ami_lat8:AM latency 8 B [usec]:1" "ami_rate8:AM message rate 8 B [msg/s]:0"
                 "ami_bw1m:AM bandwidth 1 MiB [MiB/s]:0" "ami_put1m:PUT bandwidth 1 MiB [MiB/s]:0"
                 "ami_get1m:GET bandwidth 1 MiB [MiB/s]:0")
  for size in $SIZES; do
    figures+=("lat_ami/$size:AM latency $size B [usec]:1" "bw_ami/$size:AM bandwidth $size B [MiB/s]:0"
              "put_ami/$size:PUT bandwidth $size B [MiB/s]:0" "get_ami/$size:GET bandwidth $size B [MiB/s]:0")
  done
  for spec in "${figures[@]}"; do
    IFS=: read -r key label lower <<<"$spec"
    a=$(printf '%s' "${samples[$key]:-}" | grep . | median)
    b=$(printf '%s' "${samples[base_$key]:-}" | grep . | median)
    awk -v l="$label" -v a="$a" -v b="$b" -v lo="$lower" 'BEGIN {
      r = (a > 0 && b > 0) ? (lo ? b / a : a / b) : 0
      printf "%-34s %14.3f %14.3f %9.3f\n", l, a, b, r }'
  done
}

row() {  # row LABEL AMI-KEY PEER-KEY PEER-NAME TARGET LOWER_IS_BETTER
  local a p
  a=$(printf '%s' "${samples[$2]}" | median)
  p=$(printf '%s' "${samples[$3]}" | median)
  awk -v l="$1" -v a="$a" -v p="$p" -v n="$4" -v t="$5" 'BEGIN {
    r = (p > 0) ? a / p : 0
    printf "%-28s %14.3f %14.3f  %-14s %8.3f   %s\n", l, a, p, n, r, t }'
}

report() {
  echo "# ami vs UCX (UCX_TLS=sm) and libfabric (shm); server on core $SERVER_CPU, client on core $CLIENT_CPU"
  echo "# $ROUNDS interleaved rounds, medians; $("$BUILD/tools/ami_info" | head -1 | sed 's/^# //')"
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "# round $r" >&2
    one_round
    sweep_round
  done
  printf '%-28s %14s %14s  %-14s %8s   %s\n' figure ami peer "peer is" ami/peer target
  row "AM latency 8 B [usec]"      ami_lat8  ucx_lat8  ucx_perftest "<= 1.10"
  row "AM latency 8 B [usec]"      ami_lat8  fi_lat8   fi_pingpong  "(reference)"
  row "AM message rate 8 B [msg/s]" ami_rate8 ucx_rate8 ucx_perftest ">= 1.00"
  row "AM bandwidth 1 MiB [MiB/s]" ami_bw1m  ucx_bw1m  ucx_perftest "(reference)"
  row "PUT bandwidth 1 MiB [MiB/s]" ami_put1m ucx_put1m ucx_perftest ">= 0.95"
  row "GET bandwidth 1 MiB [MiB/s]" ami_get1m ucx_get1m ucx_perftest ">= 0.95"
  if [[ -n ${SIZES// /} ]]; then
    echo
    echo "# latency by size [usec]: ami_send_lat t_typical, ucx_perftest ucp_am_lat 50%ile, fi_pingpong usec/xfer"
    sweep_table "$OUT_DIR/shm_peers_lat.dat" lat_ami:ami_AM lat_ucx:UCX_AM lat_fi:libfabric_shm
    echo
    echo "# bandwidth by size [MiB/s]: ami_*_bw average, ucx_perftest overall"
    sweep_table "$OUT_DIR/shm_peers_bw.dat" bw_ami:ami_AM bw_ucx:UCX_AM put_ami:ami_PUT put_ucx:UCX_PUT \
      get_ami:ami_GET get_ucx:UCX_GET
  fi
  # (also without the sweep: the headline figures are compared)
  if [[ -n $BASELINE ]]; then
    echo
    baseline_table
  fi
}

main() {
  ensure_packages
  ensure_build "$BUILD"
  [[ -z $BASELINE ]] || ensure_build "$BASELINE"
  mkdir -p "$OUT_DIR"
  rm -f "$OUT_DIR"/shm_peers_{lat,bw}.{dat,png}
  report | tee "$OUT_DIR/shm_peers.txt"
  [[ -n ${SIZES// /} ]] || return 0
  bench/plot.sh -t "shared memory: latency, ami vs UCX (sm) and libfabric (shm)" -y "latency [usec]" \
    "$OUT_DIR/shm_peers_lat.dat" "$OUT_DIR/shm_peers_lat.png" || true
  bench/plot.sh --pairs -t "shared memory: bandwidth, ami vs UCX (sm)" -y "bandwidth [MiB/s]" \
    "$OUT_DIR/shm_peers_bw.dat" "$OUT_DIR/shm_peers_bw.png" || true
}

main "$@"
