#!/usr/bin/env bash
# bench/shm_peers.sh — ami's shared-memory backend side by side with UCX
# (ucx_perftest, UCX_TLS=sm) and libfabric (fi_pingpong -p shm), in one run,
# server pinned to core 0 and client to core 1. Each figure is the median of
# ROUNDS interleaved runs; the ratio ami/peer is what to read, since absolute
# numbers move with the machine's load.
#
# usage: bench/shm_peers.sh [build-dir]     (ROUNDS=3 ITERS=... to change)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-3}
LAT_ITERS=${LAT_ITERS:-20000}
RATE_ITERS=${RATE_ITERS:-200000}
BW_ITERS=${BW_ITERS:-2000}
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

ensure_build() {
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
  meson compile -C "$BUILD" >/dev/null
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

ami() {  # ami TOOL SIZE ITERS -> the tool's result row
  local tool=$1 size=$2 iters=$3
  pair "$BUILD/tools/$tool" -s "$size" -n "$iters" -p "$PORT" -- \
       "$BUILD/tools/$tool" -s "$size" -n "$iters" -p "$PORT" 127.0.0.1 | awk -v s="$size" '$1 == s'
}

ucx() {  # ucx TEST SIZE ITERS -> ucx_perftest's Final line
  local test=$1 size=$2 iters=$3
  UCX_TLS=sm pair ucx_perftest -t "$test" -s "$size" -n "$iters" -p "$PORT" -- \
       ucx_perftest 127.0.0.1 -t "$test" -s "$size" -n "$iters" -p "$PORT" | grep '^Final:'
}

fabric() {  # fabric SIZE ITERS -> fi_pingpong's result row
  local size=$1 iters=$2
  pair fi_pingpong -p shm -e rdm -S "$size" -I "$iters" -B "$PORT" -- \
       fi_pingpong -p shm -e rdm -S "$size" -I "$iters" -P "$PORT" 127.0.0.1 | awk -v s="$size" '$1 == s'
}

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)]}'; }

declare -A samples
add() { samples[$1]+="$2"$'\n'; }

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
}

row() {  # row LABEL AMI-KEY PEER-KEY PEER-NAME TARGET LOWER_IS_BETTER
  local a p
  a=$(printf '%s' "${samples[$2]}" | median)
  p=$(printf '%s' "${samples[$3]}" | median)
  awk -v l="$1" -v a="$a" -v p="$p" -v n="$4" -v t="$5" 'BEGIN {
    r = (p > 0) ? a / p : 0
    printf "%-28s %14.3f %14.3f  %-14s %8.3f   %s\n", l, a, p, n, r, t }'
}

main() {
  ensure_packages
  ensure_build
  echo "# ami vs UCX (UCX_TLS=sm) and libfabric (shm); server on core $SERVER_CPU, client on core $CLIENT_CPU"
  echo "# $ROUNDS interleaved rounds, medians; $("$BUILD/tools/ami_info" | head -1 | sed 's/^# //')"
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "# round $r" >&2
    one_round
  done
  printf '%-28s %14s %14s  %-14s %8s   %s\n' figure ami peer "peer is" ami/peer target
  row "AM latency 8 B [usec]"      ami_lat8  ucx_lat8  ucx_perftest "<= 1.10"
  row "AM latency 8 B [usec]"      ami_lat8  fi_lat8   fi_pingpong  "(reference)"
  row "AM message rate 8 B [msg/s]" ami_rate8 ucx_rate8 ucx_perftest ">= 1.00"
  row "AM bandwidth 1 MiB [MiB/s]" ami_bw1m  ucx_bw1m  ucx_perftest "(reference)"
  row "PUT bandwidth 1 MiB [MiB/s]" ami_put1m ucx_put1m ucx_perftest ">= 0.95"
  row "GET bandwidth 1 MiB [MiB/s]" ami_get1m ucx_get1m ucx_perftest ">= 0.95"
}

main "$@"
