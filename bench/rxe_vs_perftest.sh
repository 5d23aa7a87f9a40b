#!/usr/bin/env bash
# bench/rxe_vs_perftest.sh — ami's verbs backend side by side with perftest
# (raw verbs) on soft-RoCE, inside ONE boot of the test VM (tests/rxe/ami-vm).
# Each pair runs with the same device options (-d rxe0 -x GID, the same
# sizes and iterations, connection by address exchange as perftest's
# default), interleaved, ROUNDS times; the figures are medians and the ratio
# ami/perftest is what to read: absolute numbers on an emulated NIC in a TCG
# VM move by tens of percent from run to run.
#
# Back on the host, the table is drawn by bench/plot.sh: bandwidth and
# latency against message size, a line per tool. Written to OUT_DIR:
# rxe_vs_perftest.txt (everything printed), rxe_vs_perftest_bw.dat/.png,
# rxe_vs_perftest_lat.dat/.png.
#
# usage: bench/rxe_vs_perftest.sh [build-dir]
#        (ROUNDS=5 LAT_ITERS=1000 BW_ITERS=5000 BW_ITERS_LARGE=1000
#         SIZES="2 4096 65536" OUT_DIR=<build-dir>/bench-results to change;
#         BW_ITERS_LARGE is for sizes above 4 KiB;
#         BASELINE=<build-dir>: another build of ami, an earlier tree, whose
#         tools run in the same rounds next to this build's; the table then
#         has a column this/baseline, higher is better: latency baseline/this)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
ROUNDS=${ROUNDS:-5}
LAT_ITERS=${LAT_ITERS:-1000}
BW_ITERS=${BW_ITERS:-5000}
BW_ITERS_LARGE=${BW_ITERS_LARGE:-1000}
SIZES=${SIZES:-2 4096 65536}
BASELINE=${BASELINE:-}
PORT=${PORT:-19100}
RUN_TIMEOUT=120

# The figures: ami tool, perftest tool and the target ratio. Bandwidth is
# the average from the message rate column (which keeps its digits at 2 B),
# in MiB/s; latency is t_typical, in usec.
readonly PAIRS=(
  "ami_write_bw  ib_write_bw  >=0.95"
  "ami_read_bw   ib_read_bw   >=0.95"
  "ami_send_bw   ib_send_bw   >=0.95"
  "ami_write_lat ib_write_lat <=1.10"
  "ami_send_lat  ib_send_lat  <=1.10"
  "ami_read_lat  ib_read_lat  <=1.10"
)

# figure TOOL SIZE < row -> the figure compared
figure() {
  if [[ $1 == *_lat ]]; then
    awk '{print $5}'
  else
    awk -v s="$2" '{printf "%.6g\n", $5 * 1e6 * s / 1048576}'
  fi
}

# ---- on the host: build, then the same script inside the VM ------------------

host_main() {
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
  local build rc=0 pair tools=()
  for pair in "${PAIRS[@]}"; do tools+=("tools/${pair%% *}"); done
  meson compile -C "$BUILD" "${tools[@]}" >/dev/null
  build=$(cd "$BUILD" && pwd)
  local base="" shares=(--share "$PWD" --share "$build")
  if [[ -n $BASELINE ]]; then
    [[ -f "$BASELINE/build.ninja" ]] || meson setup "$BASELINE" >/dev/null
    meson compile -C "$BASELINE" "${tools[@]}" >/dev/null
    base=$(cd "$BASELINE" && pwd)
    shares+=(--share "$base")
  fi
  mkdir -p "$OUT_DIR"
  rm -f "$OUT_DIR"/rxe_vs_perftest_{bw,lat}.{dat,png}
  # The VM passes only AMI_* variables on: the settings go as arguments.
  tests/rxe/ami-vm --timeout 3000 "${shares[@]}" -- "$PWD/bench/rxe_vs_perftest.sh" "$build" \
    "$ROUNDS" "$LAT_ITERS" "$BW_ITERS" "$BW_ITERS_LARGE" "$SIZES" "$base" | tee "$OUT_DIR/rxe_vs_perftest.txt" || rc=$?
  plot bw "bandwidth, average [MiB/s]" "ami vs perftest on soft-RoCE (rxe0): bandwidth"
  plot lat "latency, t_typical [usec]" "ami vs perftest on soft-RoCE (rxe0): latency"
  return "$rc"
}

# plot bw|lat YLABEL TITLE: the rows of the final table for that kind of
# test, a column per tool, drawn when there is any.
plot() {
  local kind=$1 dat=$OUT_DIR/rxe_vs_perftest_$1.dat
  awk -v kind="_$kind" '
    $1 ~ /^ami_/ && $2 ~ /^[0-9]+$/ && NF >= 4 && substr($1, length($1) - length(kind) + 1) == kind {
      ib = $1; sub(/^ami_/, "ib_", ib)
      if (!(ib in col)) { col[$1] = ++n; name[n] = $1; col[ib] = ++n; name[n] = ib }
      if (!($2 in seen)) { seen[$2] = 1; size[++m] = $2 }
      v[$2, col[$1]] = $3; v[$2, col[ib]] = $4
    }
    END {
      if (!m) exit
      printf "bytes"; for (i = 1; i <= n; i++) printf " %s", name[i]; print ""
      for (k = 1; k <= m; k++) {
        printf "%s", size[k]
        for (i = 1; i <= n; i++) printf " %s", ((size[k], i) in v) ? v[size[k], i] : "nan"
        print ""
      }
    }' "$OUT_DIR/rxe_vs_perftest.txt" >"$dat"
  [[ -s $dat ]] || { rm -f "$dat"; return 0; }
  bench/plot.sh --pairs -t "$3" -y "$2" "$dat" "$OUT_DIR/rxe_vs_perftest_$kind.png" || true
}

# ---- in the VM ---------------------------------------------------------------

device=${AMI_NET_DEVICES:-rxe0:1}
device=${device%%:*}

. tests/rxe/perftest_pair.sh

# perftest TOOL SIZE ITERS -> the client's result row
perftest() {
  local tool=$1 size=$2 iters=$3 extra=() out=/tmp/bench-perftest
  [[ $tool == *_lat ]] && extra=(-F)  # no cpufreq in the VM: do not refuse over it
  perftest_pair "$out" "$PORT" "$RUN_TIMEOUT" "$tool" -d "$device" -x "$RXE_GID_INDEX" -s "$size" \
    -n "$iters" "${extra[@]}" || echo "$tool -s $size failed: $(tail -1 "$out.client")" >&2
  PORT=$((PORT + 3))
  awk -v s="$size" '$1 == s' "$out.client"
}

# ami TOOL SIZE ITERS [BUILD] -> the result row (both sides from one command)
ami() {
  local tool=$1 size=$2 iters=$3 build=${4:-$BUILD} out
  out=$(AMI_VERBS_CM=off timeout "$RUN_TIMEOUT" "$build/tools/$tool" --local -d "$device" -x "$RXE_GID_INDEX" \
        -s "$size" -n "$iters" -p "$PORT" 2>&1) || echo "$tool -s $size failed: $(tail -3 <<<"$out")" >&2
  PORT=$((PORT + 1))
  awk -v s="$size" '$1 == s' <<<"$out"
}

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)]}'; }

declare -A samples
add() { [[ -n $2 ]] && samples[$1]+="$2"$'\n'; return 0; }

one_round() {
  local pair a p target size iters
  for pair in "${PAIRS[@]}"; do
    read -r a p target <<<"$pair"
    for size in $SIZES; do
      iters=$BW_ITERS
      ((size > 4096)) && iters=$BW_ITERS_LARGE
      [[ $a == *_lat ]] && iters=$LAT_ITERS
      add "$a/$size" "$(ami "$a" "$size" "$iters" | figure "$a" "$size")"
      add "$p/$size" "$(perftest "$p" "$size" "$iters" | figure "$p" "$size")"
      [[ -z $BASELINE ]] || add "base:$a/$size" "$(ami "$a" "$size" "$iters" "$BASELINE" | figure "$a" "$size")"
    done
  done
}

vm_main() {
  BUILD=$1 ROUNDS=$2 LAT_ITERS=$3 BW_ITERS=$4 BW_ITERS_LARGE=$5 SIZES=$6 BASELINE=${7:-}
  local r pair a p target size ma mp mb
  echo "# ami vs perftest on $device (soft-RoCE in a TCG VM), GID index $RXE_GID_INDEX"
  echo "# $ROUNDS interleaved rounds, medians; bandwidth: average [MiB/s]; latency: t_typical [usec]"
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "# round $r" >&2
    one_round
  done
  [[ -z $BASELINE ]] || echo "# baseline: $BASELINE (this/base: higher is better for this build)"
  printf '%-14s %8s %12s %12s %10s   %-8s' test bytes ami perftest ami/perf target
  [[ -z $BASELINE ]] && echo || printf ' %12s %9s\n' baseline this/base
  for pair in "${PAIRS[@]}"; do
    read -r a p target <<<"$pair"
    for size in $SIZES; do
      ma=$(printf '%s' "${samples[$a/$size]:-}" | median)
      mp=$(printf '%s' "${samples[$p/$size]:-}" | median)
      mb=$(printf '%s' "${samples[base:$a/$size]:-}" | median)
      awk -v t="$a" -v s="$size" -v a="$ma" -v p="$mp" -v g="$target" -v b="$mb" -v base="${BASELINE:+1}" 'BEGIN {
        r = (p + 0 > 0 && a + 0 > 0) ? sprintf("%.3f", a / p) : "n/a"
        printf "%-14s %8d %12s %12s %10s   %-8s", t, s, a, p, r, g
        if (!base) { print ""; exit }
        q = (b + 0 > 0 && a + 0 > 0) ? sprintf("%.3f", t ~ /_lat$/ ? b / a : a / b) : "n/a"
        printf " %12s %9s\n", b, q }'
    done
  done
}

if [[ ${RXE_VM:-} == 1 ]]; then
  vm_main "$@"
else
  host_main
fi
