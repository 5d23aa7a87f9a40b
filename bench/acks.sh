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
# The same rounds measure both at the larger SIZES too (fewer iterations:
# each run moves about as many bytes as an 8 B run, at least 1000 messages
# streaming and 200 round trips); the latency and the bandwidth by size,
# batched and immediate on each backend, are printed as two more tables and
# drawn by bench/plot.sh. Written to OUT_DIR: acks.txt (everything
# printed), acks_lat.dat/.png, acks_bw.dat/.png.
#
# usage: bench/acks.sh [build-dir]
#        ROUNDS=5                 rounds per backend (at least 3)
#        BW_ITERS=2000000 LAT_ITERS=50000          shm iterations at 8 B
#        RXE_BW_ITERS=... RXE_LAT_ITERS=...         rxe iterations at 8 B
#        SIZES="8 512 4096 32768"                   sizes of the sweep (8 B always)
#        SKIP_SHM=1 SKIP_RXE=1                      leave a backend out
#        NO_BUILD=1               measure the build directory as it is
#        VERBOSE=1                every run's figures on stderr
#        OUT_DIR=<build-dir>/bench-results
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
SIZES=${SIZES:-8 512 4096 32768}
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
PORT=${PORT:-19200}
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
readonly ACK_TARGET=0.05 LAT_TARGET=1.05

# Extra arguments of every tool run (the device options on rxe).
DEVICE_ARGS=()

# run TOOL ITERS MODE PORT [SIZE] -> "figure acks-per-message threshold
# window": the figure is t_typical [usec] for latency, the message rate
# [Mmsg/s] for bandwidth; acks per message over every "# acks:" line (both
# sides in latency). MODE immediate acknowledges every message at once.
# SIZE: 8 unless given.
run() {
  local tool=$1 iters=$2 mode=$3 port=$4 size=${5:-8} out env=()
  [[ $mode == immediate ]] && env=(AMI_ACK_IDLE_THRESHOLD=0)
  out=$(env "${env[@]}" timeout "$RUN_TIMEOUT" "$BUILD/tools/$tool" --local "${DEVICE_ARGS[@]}" -s "$size" \
        -n "$iters" --remote_done -p "$port" 2>&1) ||
    echo "$tool -s $size ($mode) failed: $(tail -3 <<<"$out")" >&2
  [[ $VERBOSE == 1 ]] && { grep -E "^ $size |^# acks: " <<<"$out" | sed "s/^/# $tool $mode: /" >&2 || true; }
  awk -v s="$size" '$1 == s && NF >= 5 { figure = $5 }
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

# key KIND MODE SIZE: where a run's figures go; the 8 B ones are the table's.
key() { if (($3 == 8)); then echo "$1/$2"; else echo "$1/$2/$3"; fi; }

# scaled ITERS SIZE MIN: ITERS at 8 B, as many bytes at SIZE, at least MIN.
scaled() { awk -v n="$1" -v s="$2" -v m="$3" 'BEGIN { k = int(n * 8 / s); if (k > n) k = n; if (k < m) k = m; print k }'; }

# one_round N BW_ITERS LAT_ITERS: each measurement batched and immediate,
# in an order that alternates from round to round, at every size.
one_round() {
  local r=$1 bw=$2 lat=$3 modes=(batched immediate) mode size
  ((r % 2 == 0)) && modes=(immediate batched)
  for size in $SIZES; do
    for mode in "${modes[@]}"; do
      add "$(key bw "$mode" "$size")" "$(run ami_send_bw "$(scaled "$bw" "$size" 1000)" "$mode" "$PORT" "$size")"
      PORT=$((PORT + 1))
    done
    for mode in "${modes[@]}"; do
      add "$(key lat "$mode" "$size")" "$(run ami_send_lat "$(scaled "$lat" "$size" 200)" "$mode" "$PORT" "$size")"
      PORT=$((PORT + 1))
    done
  done
}

# sweep_file FILE: the medians by size of one backend, for the host's tables:
# "bytes lat_batched lat_immediate bw_batched bw_immediate", latency in
# usec, bandwidth in MiB/s (from the message rate).
sweep_file() {
  local size mode lat bw
  {
    echo "bytes lat_batched lat_immediate bw_batched bw_immediate"
    for size in $SIZES; do
      printf '%s' "$size"
      for mode in batched immediate; do printf ' %s' "$(column "$(key lat "$mode" "$size")" 1 %.3f)"; done
      for mode in batched immediate; do
        column "$(key bw "$mode" "$size")" 1 %.6f |
          awk -v s="$size" '{ if ($1 == "nan") printf " nan"; else printf " %.2f", $1 * 1e6 * s / 1048576 }'
      done
      echo
    done
  } >"$1"
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

# measure NAME BW_ITERS LAT_ITERS [SWEEP_FILE]: the rounds and the table of
# one backend; the medians by size into SWEEP_FILE.
measure() {
  local name=$1 bw=$2 lat=$3 sweep=${4:-} r
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
  [[ -z $sweep ]] || sweep_file "$sweep"
}

# by_size: the tables of latency and bandwidth by size, batched and
# immediate on each backend measured, printed and written for plot.sh.
by_size() {
  local b files=() names=()
  for b in shm rxe; do
    [[ -s $OUT_DIR/acks_$b.sweep ]] && files+=("$OUT_DIR/acks_$b.sweep") && names+=("$b")
  done
  ((${#files[@]})) || return 0
  echo
  echo "# latency by size [usec], t_typical (8 B sends above; medians of the same rounds)"
  join_sweeps 2 3 "${files[@]}" | tee "$OUT_DIR/acks_lat.dat" | align
  echo
  echo "# bandwidth by size [MiB/s], from the message rate"
  join_sweeps 4 5 "${files[@]}" | tee "$OUT_DIR/acks_bw.dat" | align
}

align() { awk '{ printf "%-10s", $1; for (i = 2; i <= NF; i++) printf " %16s", $i; print "" }'; }

# join_sweeps BATCHED_FIELD IMMEDIATE_FIELD FILE...: one table, bytes and
# two columns per file ("shm_batched shm_immediate ..."); FILE names the
# backend (acks_<backend>.sweep).
join_sweeps() {
  local batched=$1 immediate=$2
  shift 2
  awk -v fb="$batched" -v fi="$immediate" '
    FNR == 1 { f++; b = FILENAME; sub(/.*acks_/, "", b); sub(/\.sweep$/, "", b); name[f] = b; next }
    { if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 }; v[$1, f, 1] = $fb; v[$1, f, 2] = $fi }
    END {
      printf "bytes"
      for (i = 1; i <= f; i++) printf " %s_batched %s_immediate", name[i], name[i]
      print ""
      for (k = 1; k <= n; k++) {
        printf "%s", order[k]
        for (i = 1; i <= f; i++) for (j = 1; j <= 2; j++) printf " %s", ((order[k], i, j) in v) ? v[order[k], i, j] : "nan"
        print ""
      }
    }' "$@"
}

# ---- on the host: build, shm, then the same script inside the VM -------------

host_main() {
  ((ROUNDS >= 3)) || { echo "ROUNDS must be at least 3" >&2; exit 2; }
  [[ " $SIZES " == *" 8 "* ]] || SIZES="8 $SIZES"
  mkdir -p "$OUT_DIR"
  OUT_DIR=$(cd "$OUT_DIR" && pwd)
  rm -f "$OUT_DIR"/acks_{shm,rxe}.sweep "$OUT_DIR"/acks_{lat,bw}.{dat,png}
  local rc=0
  host_measure | tee "$OUT_DIR/acks.txt" || rc=$?
  if [[ -s $OUT_DIR/acks_lat.dat ]]; then
    bench/plot.sh --pairs -t "ping-pong of sends with remote_done: latency, acks batched and immediate" \
      -y "latency, t_typical [usec]" "$OUT_DIR/acks_lat.dat" "$OUT_DIR/acks_lat.png" || true
    bench/plot.sh --pairs -t "streaming sends with remote_done: bandwidth, acks batched and immediate" \
      -y "bandwidth [MiB/s]" "$OUT_DIR/acks_bw.dat" "$OUT_DIR/acks_bw.png" || true
  fi
  rm -f "$OUT_DIR"/acks_{shm,rxe}.sweep
  return "$rc"
}

host_measure() {
  if [[ $NO_BUILD != 1 ]]; then
    local log
    [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
    log=$(meson compile -C "$BUILD" 2>&1) || { tail -20 <<<"$log" >&2; echo "the build failed" >&2; exit 1; }
  fi
  local build
  build=$(cd "$BUILD" && pwd)
  BUILD=$build
  echo "# ami acknowledgements: batched against immediate; $("$BUILD/tools/ami_info" | head -1 | sed 's/^# //')"
  [[ $SKIP_SHM == 1 ]] || measure shm "$BW_ITERS" "$LAT_ITERS" "$OUT_DIR/acks_shm.sweep"
  local rc=0
  if [[ $SKIP_RXE != 1 ]]; then
    echo
    echo "# rxe: booting the test VM" >&2
    # The VM passes only AMI_* variables on: the settings go as arguments.
    tests/rxe/ami-vm --timeout 3000 --share "$PWD" --share "$build" --share "$OUT_DIR" -- \
      "$PWD/bench/acks.sh" "$build" "$ROUNDS" "$RXE_BW_ITERS" "$RXE_LAT_ITERS" "$RUN_TIMEOUT" "$VERBOSE" \
      "$SIZES" "$OUT_DIR" || rc=$?
    ((rc == 0)) || echo "# rxe: the VM run ended with status $rc (77: the VM cannot run here)"
  fi
  by_size
  return "$rc"
}

# ---- in the VM ---------------------------------------------------------------

vm_main() {
  BUILD=$1 ROUNDS=$2 RUN_TIMEOUT=$5 VERBOSE=$6 SIZES=$7 OUT_DIR=$8
  local device=${AMI_NET_DEVICES:-rxe0:1}
  device=${device%%:*}
  export AMI_VERBS_CM=off  # address exchange, as perftest's default
  DEVICE_ARGS=(-d "$device" -x "$RXE_GID_INDEX")
  PORT=19300
  measure "rxe ($device, soft-RoCE in a TCG VM, GID index $RXE_GID_INDEX)" "$3" "$4" "$OUT_DIR/acks_rxe.sweep"
}

if [[ ${RXE_VM:-} == 1 ]]; then
  vm_main "$@"
else
  host_main
fi
