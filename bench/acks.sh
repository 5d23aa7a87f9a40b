#!/usr/bin/env bash
# bench/acks.sh — what batched acknowledgements cost and save, on shm (two
# processes on this host, --local) and on soft-RoCE (both processes inside
# ONE boot of the test VM, tests/rxe/ami-vm, over rxe0). Every measured send
# asks for remote_done (--remote_done):
#   - streaming 8 B sends (ami_send_bw): acks per message under load with
#     the default batching (target <= 0.05), and the message rate;
#   - 8 B ping-pong (ami_send_lat): t_typical with batching against acks
#     sent at once (AMI_ACK_IDLE_THRESHOLD=0), target batched/immediate
#     <= 1.05; the streaming rate is compared the same way.
# Batched and immediate runs are interleaved (their order alternates from
# round to round), ROUNDS times; the figures are medians and the ratios are
# ratios of medians, since absolute numbers move with the machine's load.
#
# usage: bench/acks.sh [build-dir]
#        ROUNDS=5                 rounds per backend (at least 3)
#        BW_ITERS=2000000 LAT_ITERS=50000          shm iterations
#        RXE_BW_ITERS=... RXE_LAT_ITERS=...         rxe iterations
#        SKIP_SHM=1 SKIP_RXE=1                      leave a backend out
#        NO_BUILD=1               measure the build directory as it is
#        VERBOSE=1                every run's figures on stderr
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-5}
BW_ITERS=${BW_ITERS:-2000000}
LAT_ITERS=${LAT_ITERS:-50000}
RXE_BW_ITERS=${RXE_BW_ITERS:-15000}
RXE_LAT_ITERS=${RXE_LAT_ITERS:-2000}
SKIP_SHM=${SKIP_SHM:-0}
SKIP_RXE=${SKIP_RXE:-0}
NO_BUILD=${NO_BUILD:-0}
VERBOSE=${VERBOSE:-0}
PORT=${PORT:-19200}
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
readonly ACK_TARGET=0.05 LAT_TARGET=1.05

# Extra arguments of every tool run (the device options on rxe).
DEVICE_ARGS=()

# run TOOL ITERS MODE PORT -> "figure acks-per-message threshold window": the
# figure is t_typical [usec] for latency, the message rate [Mmsg/s] for
# bandwidth; acks per message over every "# acks:" line (both sides in
# latency). MODE immediate acknowledges every message at once.
run() {
  local tool=$1 iters=$2 mode=$3 port=$4 out env=()
  [[ $mode == immediate ]] && env=(AMI_ACK_IDLE_THRESHOLD=0)
  out=$(env "${env[@]}" timeout "$RUN_TIMEOUT" "$BUILD/tools/$tool" --local "${DEVICE_ARGS[@]}" -s 8 \
        -n "$iters" --remote_done -p "$port" 2>&1) ||
    echo "$tool ($mode) failed: $(tail -3 <<<"$out")" >&2
  [[ $VERBOSE == 1 ]] && { grep -E '^ 8 |^# acks: ' <<<"$out" | sed "s/^/# $tool $mode: /" >&2 || true; }
  awk '$1 == 8 && NF >= 5 { figure = $5 }
       /^# acks: / { m += $3; a += $7; t = $(NF - 2); sub(/,$/, "", t); w = $NF }
       END { if (figure != "" && m > 0) printf "%s %.6f %s %s\n", figure, a / m, t, w }' <<<"$out"
}

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)]}'; }

declare -A samples
add() { [[ -n $2 ]] && samples[$1]+="$2"$'\n'; return 0; }
# column KEY N FORMAT: the median of field N of KEY's samples, printf'd.
column() {
  printf '%s' "${samples[$1]:-}" | awk -v c="$2" '{print $c}' | median |
    awk -v f="$3" '{ if ($1 == "nan") print "nan"; else printf f "\n", $1 }'
}

# one_round N BW_ITERS LAT_ITERS: each measurement batched and immediate,
# in an order that alternates from round to round.
one_round() {
  local r=$1 bw=$2 lat=$3 modes=(batched immediate) mode
  ((r % 2 == 0)) && modes=(immediate batched)
  for mode in "${modes[@]}"; do
    add "bw/$mode" "$(run ami_send_bw "$bw" "$mode" "$PORT")"
    PORT=$((PORT + 1))
  done
  for mode in "${modes[@]}"; do
    add "lat/$mode" "$(run ami_send_lat "$lat" "$mode" "$PORT")"
    PORT=$((PORT + 1))
  done
}

# row LABEL BATCHED IMMEDIATE VALUE TARGET: VALUE is compared with TARGET
# ("<= x"); a TARGET in parentheses is not checked.
row() {
  awk -v l="$1" -v b="$2" -v i="$3" -v v="$4" -v t="$5" 'BEGIN {
    verdict = ""
    if (t ~ /^<=/) {
      limit = substr(t, 3) + 0
      verdict = (v != "nan" && v != "" && v + 0 <= limit) ? "met" : "missed"
    }
    printf "%-40s %12s %12s %10s   %-12s %s\n", l, b, i, v, t, verdict }'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.3f", a / b; else print "nan" }'; }

# measure NAME BW_ITERS LAT_ITERS: the rounds and the table of one backend.
measure() {
  local name=$1 bw=$2 lat=$3 r
  samples=()
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "# $name round $r of $ROUNDS" >&2
    one_round "$r" "$bw" "$lat"
  done
  local bw_b bw_i ack_b ack_i lat_b lat_i lack_b lack_i n_b n_l config
  bw_b=$(column bw/batched 1 %.4f); bw_i=$(column bw/immediate 1 %.4f)
  ack_b=$(column bw/batched 2 %.4f); ack_i=$(column bw/immediate 2 %.4f)
  lat_b=$(column lat/batched 1 %.2f); lat_i=$(column lat/immediate 1 %.2f)
  lack_b=$(column lat/batched 2 %.4f); lack_i=$(column lat/immediate 2 %.4f)
  n_b=$(printf '%s' "${samples[bw/batched]:-}" | grep -c . || true)
  n_l=$(printf '%s' "${samples[lat/batched]:-}" | grep -c . || true)
  config=$(printf '%s' "${samples[bw/batched]:-}" | awk 'NR == 1 {printf "idle threshold %s, window %s", $3, $4}')
  echo
  echo "# $name: 8 B sends with --remote_done; batched: ${config:-no run succeeded}; immediate: AMI_ACK_IDLE_THRESHOLD=0"
  echo "# medians of $ROUNDS interleaved rounds (runs that completed, batched: $n_b ami_send_bw -n $bw," \
       "$n_l ami_send_lat -n $lat)"
  echo "# value: batched/immediate, or for acks per message the batched figure"
  printf '%-40s %12s %12s %10s   %-12s %s\n' figure batched immediate value target verdict
  row "acks per message, streaming (send_bw)" "$ack_b" "$ack_i" "$ack_b" "<= $ACK_TARGET"
  row "message rate, streaming [Mmsg/s]" "$bw_b" "$bw_i" "$(ratio "$bw_b" "$bw_i")" "(reference)"
  row "latency t_typical, ping-pong [usec]" "$lat_b" "$lat_i" "$(ratio "$lat_b" "$lat_i")" "<= $LAT_TARGET"
  row "acks per message, ping-pong (send_lat)" "$lack_b" "$lack_i" "$lack_b" "(reference)"
}

# ---- on the host: build, shm, then the same script inside the VM -------------

host_main() {
  ((ROUNDS >= 3)) || { echo "ROUNDS must be at least 3" >&2; exit 2; }
  if [[ $NO_BUILD != 1 ]]; then
    local log
    [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
    log=$(meson compile -C "$BUILD" 2>&1) || { tail -20 <<<"$log" >&2; echo "the build failed" >&2; exit 1; }
  fi
  local build
  build=$(cd "$BUILD" && pwd)
  BUILD=$build
  echo "# ami acknowledgements: batched against immediate; $("$BUILD/tools/ami_info" | head -1 | sed 's/^# //')"
  [[ $SKIP_SHM == 1 ]] || measure shm "$BW_ITERS" "$LAT_ITERS"
  [[ $SKIP_RXE == 1 ]] && return 0
  echo
  echo "# rxe: booting the test VM" >&2
  # The VM passes only AMI_* variables on: the settings go as arguments.
  local rc=0
  tests/rxe/ami-vm --timeout 3000 --share "$PWD" --share "$build" -- "$PWD/bench/acks.sh" "$build" "$ROUNDS" \
    "$RXE_BW_ITERS" "$RXE_LAT_ITERS" "$RUN_TIMEOUT" "$VERBOSE" || rc=$?
  ((rc == 0)) || echo "# rxe: the VM run ended with status $rc (77: the VM cannot run here)"
  return "$rc"
}

# ---- in the VM ---------------------------------------------------------------

vm_main() {
  BUILD=$1 ROUNDS=$2 RUN_TIMEOUT=$5 VERBOSE=$6
  local device=${AMI_NET_DEVICES:-rxe0:1}
  device=${device%%:*}
  export AMI_VERBS_CM=off  # address exchange, as perftest's default
  DEVICE_ARGS=(-d "$device" -x "$RXE_GID_INDEX")
  PORT=19300
  measure "rxe ($device, soft-RoCE in a TCG VM, GID index $RXE_GID_INDEX)" "$3" "$4"
}

if [[ ${RXE_VM:-} == 1 ]]; then
  vm_main "$@"
else
  host_main
fi
