#!/usr/bin/env bash
# bench/atomics.sh — remote atomics (docs/DESIGN.md, "Remote atomics"):
# ami_atomic_lat and ami_atomic_bw against their peers on the same path,
# interleaved rounds, medians, ratios.
#
# On this host (default): a 64-bit fetch-and-add and compare-and-swap on
# a peer's word over shared memory, ami (--local: an allocate_memory()
# region the client maps, so the op is its own CPU's, done in the call by
# atomic_now()) against ucx_perftest -t ucp_fadd / ucp_cswap with
# UCX_TLS=sm (UCX's CPU atomics on its mapped segment, completed in place
# by ucp_atomic_op_nbx). Latency: ami's t_typical (its JSON report, to the
# nanosecond) against UCX's 50th percentile, one operation each; rate: ami's
# MsgRate with -o OUTSTANDING in flight against UCX's overall message rate
# (ucx_perftest posts back to back).
#
# --rxe: in one soft-RoCE VM boot (tests/rxe/ami-vm), ami over verbs
# against perftest's ib_atomic_lat and ib_atomic_bw (-A FETCH_AND_ADD and
# CMP_AND_SWAP, the same -o) on rxe0. ami runs twice: with its target's
# region in the NIC's atomic domain (AMI_ATOMIC_MODE=nic: the origin's NIC
# does the op, as perftest's does; rxe: the kernel), the row judged against
# the target, and in the CPU's (AMI_ATOMIC_MODE=cpu: a message its target's
# engine executes), for reference (docs/DESIGN.md, "Remote atomics").
#
# Targets (issue text): on shm latency <= 1.10x and rate >= 0.95x UCX's;
# on rxe latency <= 1.10x and rate >= 0.95x perftest's.
#
# Written to OUT_DIR: atomics.txt (or atomics_rxe.txt), a .dat of the
# rounds, and two plots of them by bench/plot.sh (when gnuplot is present):
# atomics[_rxe]_lat.png and atomics[_rxe]_rate.png, one line per tool and
# operation against the round, ami's and its peer's in pairs.
#
# usage: bench/atomics.sh [--rxe] [build-dir]
#        ROUNDS=5 OUTSTANDING=16 OUT_DIR=<build-dir>/bench-results
#        ITERS=1000000 on the host (ami's and ucx_perftest's rate runs: ten
#          times that; at some 20 ns an op, shorter runs measure their own
#          start), 100000 with --rxe
set -euo pipefail
cd "$(dirname "$0")/.."
RXE=0
if [[ ${1:-} == --rxe ]]; then
  RXE=1
  shift
fi
BUILD=${1:-build}
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-$((RXE ? 100000 : 1000000))}
OUTSTANDING=${OUTSTANDING:-16}
PORT=${PORT:-19700}
RUN_TIMEOUT=300
OPS=(FETCH_AND_ADD CMP_AND_SWAP)

. bench/rounds.sh
JSON=$(mktemp)
trap 'rm -f "$JSON"' EXIT

# ami TOOL ARGS... -> the figure of its 8-byte row: t_typical (lat, from
# the JSON report) or the message rate in Mops/s (bw)
ami() {
  local tool=$1 out
  shift
  rm -f "$JSON"
  out=$(timeout "$RUN_TIMEOUT" "$BUILD/tools/$tool" -p "$PORT" --out_json --out_json_file="$JSON" "$@" 2>&1) ||
    echo "$tool $* failed: $(tail -3 <<<"$out")" >&2
  PORT=$((PORT + 1))
  if [[ $tool == *_lat ]]; then
    python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    if r["bytes"] == 8: print("%.4f" % r["t_typical"])' "$JSON" 2>/dev/null ||
      awk '$1 == 8 && NF >= 5 {print $5}' <<<"$out"
  else
    awk '$1 == 8 && NF >= 5 {print $5}' <<<"$out"
  fi
}

# plot_rounds DAT STEM PEER NAME LAT RATE: from the rounds' table DAT
# (columns "round op ..."), STEM_lat.png and STEM_rate.png: for each op,
# ami's column LAT (RATE) and the peer's (the column PEER_lat, PEER_rate;
# NAME in the legend) against the round, in pairs.
plot_rounds() {
  local dat=$1 stem=$2 peer=$3 name=$4 what col unit where=shm
  [[ $stem == *_rxe ]] && where=soft-RoCE
  [[ -s $dat ]] || { echo "# no plots: $dat is missing" >&2; return 0; }
  for what in lat rate; do
    col=$5
    [[ $what == rate ]] && col=$6
    unit="latency [usec]"
    [[ $what == rate ]] && unit="rate [Mops/s]"
    awk -v a="$col" -v b="${peer}_$what" -v p="$name" '
      NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
      { if (!($2 in seen)) { seen[$2] = 1; ops[++n] = $2 }
        v[$1, $2] = $(c[a]) " " $(c[b]); if ($1 > last) last = $1 }
      END { printf "round"; for (k = 1; k <= n; k++) printf " ami_%s %s_%s", ops[k], p, ops[k]; print ""
            for (r = 1; r <= last; r++) { printf "%d", r
              for (k = 1; k <= n; k++) printf " %s", ((r, ops[k]) in v) ? v[r, ops[k]] : "- -"; print "" } }' \
      "$dat" >"$stem.$what.dat"
    bench/plot.sh --linear-x --pairs -x round -y "$unit" -t "64-bit atomics over $where: $unit by round" \
      "$stem.$what.dat" "${stem}_$what.png" >/dev/null 2>&1 || echo "# no plot ${stem}_$what.png (gnuplot?)" >&2
  done
}

# ---- on the host ---------------------------------------------------------------

# ucx TEST N FIELD -> a figure of ucx_perftest's one-line (-f) report of N
# operations: FIELD 2 its 50th percentile [usec], 8 its overall message rate
ucx() {
  local test=$1 n=$2 field=$3 out spid
  UCX_TLS=sm timeout "$RUN_TIMEOUT" ucx_perftest -t "$test" -n "$n" -w 1000 -p "$PORT" -c 0 -f >/dev/null 2>&1 &
  spid=$!
  sleep 0.5
  out=$(UCX_TLS=sm timeout "$RUN_TIMEOUT" ucx_perftest -t "$test" -n "$n" -w 1000 -p "$PORT" -c 1 -f localhost 2>&1) ||
    echo "ucx_perftest -t $test failed: $(tail -3 <<<"$out")" >&2
  wait "$spid" || true
  PORT=$((PORT + 1))
  # iterations, 50th percentile, average, overall [usec], bandwidth avg and
  # overall, message rate avg and overall
  awk -v f="$field" '$1 ~ /^[0-9]+$/ && NF >= 8 {print $f; exit}' <<<"$out"
}

host_main() {
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
  meson compile -C "$BUILD" tools/ami_atomic_lat tools/ami_atomic_bw >/dev/null
  ensure_ucx
  mkdir -p "$OUT_DIR"
  local txt=$OUT_DIR/atomics.txt dat=$OUT_DIR/atomics.dat r op u
  {
    echo "# 64-bit atomics on a peer's word over shared memory, both sides pinned by the tools;"
    echo "# $ROUNDS interleaved rounds; latency [usec] one op, runs of $ITERS; rate [Mops/s], runs of"
    echo "# $((ITERS * 10)), ami with -o $OUTSTANDING (ucx_perftest posts back to back)"
    echo "round op ami_lat ucx_lat ami_rate ucx_rate" >"$dat"
    for ((r = 1; r <= ROUNDS; r++)); do
      for op in "${OPS[@]}"; do
        local t=ucp_fadd
        [[ $op == CMP_AND_SWAP ]] && t=ucp_cswap
        add "ami_lat_$op" "$(ami ami_atomic_lat --local -A "$op" -n "$ITERS")"
        add "ucx_lat_$op" "$(ucx "$t" "$ITERS" 2)"
        add "ucx_rate_$op" "$(awk -v r="$(ucx "$t" "$((ITERS * 10))" 8)" 'BEGIN { if (r + 0 > 0) printf "%.3f", r / 1e6 }')"
        add "ami_rate_$op" "$(ami ami_atomic_bw --local -A "$op" -o "$OUTSTANDING" -n "$((ITERS * 10))")"
        echo "# round $r $op: ami $(last "ami_lat_$op") us, $(last "ami_rate_$op") Mops/s;" \
          "ucx ($t) $(last "ucx_lat_$op") us, $(last "ucx_rate_$op") Mops/s"
        echo "$r $op $(last "ami_lat_$op") $(last "ucx_lat_$op") $(last "ami_rate_$op") $(last "ucx_rate_$op")" >>"$dat"
      done
    done
    printf '%-28s %10s %10s %9s   %s\n' measure ami ucx ami/ucx target
    for op in "${OPS[@]}"; do
      local al ul ar ur
      al=$(med "ami_lat_$op") ul=$(med "ucx_lat_$op") ar=$(med "ami_rate_$op") ur=$(med "ucx_rate_$op")
      printf '%-28s %10s %10s %9s   %s\n' "$op latency [usec]" "$al" "$ul" "$(ratio "$al" "$ul")" "<=1.10"
      printf '%-28s %10s %10s %9s   %s\n' "$op rate [Mops/s]" "$ar" "$ur" "$(ratio "$ar" "$ur")" ">=0.95"
    done
  } | tee "$txt"
  plot_rounds "$dat" "$OUT_DIR/atomics" ucx ucx_perftest ami_lat ami_rate
}

# ---- --rxe: on the host, then in the VM -----------------------------------------

rxe_host_main() {
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
  meson compile -C "$BUILD" tools/ami_atomic_lat tools/ami_atomic_bw >/dev/null
  local build
  build=$(cd "$BUILD" && pwd)
  mkdir -p "$OUT_DIR"
  # The VM passes only AMI_* variables on: the settings go as arguments.
  tests/rxe/ami-vm --timeout 3000 --share "$PWD" --share "$build" -- "$PWD/bench/atomics.sh" --rxe-vm "$build" \
    "$ROUNDS" "$ITERS" "$OUTSTANDING" | tee "$OUT_DIR/atomics_rxe.txt"
  cp "$build/bench-results/atomics_rxe.dat" "$OUT_DIR/atomics_rxe.dat" 2>/dev/null || true
  plot_rounds "$OUT_DIR/atomics_rxe.dat" "$OUT_DIR/atomics_rxe" ib perftest ami_nic_lat ami_nic_rate
}

rxe_vm_main() {
  BUILD=$1 ROUNDS=$2 ITERS=$3 OUTSTANDING=$4
  local device=${AMI_NET_DEVICES:-rxe0:1} r op out=/tmp/bench-atomics
  device=${device%%:*}
  . tests/rxe/perftest_pair.sh
  ib() {  # ib TOOL ARGS... -> t_typical (lat) or MsgRate (bw) of its 8-byte row
    perftest_pair "$out" "$PORT" "$RUN_TIMEOUT" "$@" -d "$device" -x "$RXE_GID_INDEX" -F ||
      echo "$* failed: $(tail -1 "$out.client")" >&2
    PORT=$((PORT + 3))
    awk '$1 == 8 && NF >= 5 {print $5}' "$out.client"
  }
  amiv() {  # amiv MODE TOOL ARGS...: both sides in this VM (--local), over verbs on rxe0
    local mode=$1 tool=$2
    shift 2
    AMI_ATOMIC_MODE=$mode AMI_VERBS_CM=off ami "$tool" --local -d "$device" -x "$RXE_GID_INDEX" "$@"
  }
  local dat=$BUILD/bench-results/atomics_rxe.dat
  mkdir -p "$(dirname "$dat")"
  echo "round op ami_nic_lat ami_cpu_lat ib_lat ami_nic_rate ami_cpu_rate ib_rate" >"$dat"
  echo "# 64-bit atomics over $device (soft-RoCE in a TCG VM), $ROUNDS interleaved rounds of $ITERS;"
  echo "# latency t_typical [usec], rate [Mpps] with -o $OUTSTANDING; ami nic: the origin's (soft) NIC, as"
  echo "# perftest's; ami cpu: a message the target's engine executes"
  for ((r = 1; r <= ROUNDS; r++)); do
    for op in "${OPS[@]}"; do
      add "nic_lat_$op" "$(amiv nic ami_atomic_lat -A "$op" -n "$ITERS")"
      add "ib_lat_$op" "$(ib ib_atomic_lat -A "$op" -n "$ITERS")"
      add "cpu_lat_$op" "$(amiv cpu ami_atomic_lat -A "$op" -n "$ITERS")"
      add "nic_rate_$op" "$(amiv nic ami_atomic_bw -A "$op" -o "$OUTSTANDING" -n "$ITERS")"
      add "ib_rate_$op" "$(ib ib_atomic_bw -A "$op" -o "$OUTSTANDING" -n "$ITERS")"
      add "cpu_rate_$op" "$(amiv cpu ami_atomic_bw -A "$op" -o "$OUTSTANDING" -n "$ITERS")"
      echo "# round $r $op: ami nic $(last "nic_lat_$op") us, $(last "nic_rate_$op") Mpps;" \
        "ami cpu $(last "cpu_lat_$op") us, $(last "cpu_rate_$op") Mpps;" \
        "perftest $(last "ib_lat_$op") us, $(last "ib_rate_$op") Mpps"
      echo "$r $op $(last "nic_lat_$op") $(last "cpu_lat_$op") $(last "ib_lat_$op") $(last "nic_rate_$op")" \
        "$(last "cpu_rate_$op") $(last "ib_rate_$op")" >>"$dat"
    done
  done
  printf '%-34s %10s %10s %9s   %s\n' measure ami perftest ami/ib target
  for op in "${OPS[@]}"; do
    local il ir m
    il=$(med "ib_lat_$op") ir=$(med "ib_rate_$op")
    for m in nic cpu; do
      local target_lat="<=1.10" target_rate=">=0.95" al ar
      [[ $m == cpu ]] && target_lat="(reference)" target_rate="(reference)"
      al=$(med "${m}_lat_$op") ar=$(med "${m}_rate_$op")
      printf '%-34s %10s %10s %9s   %s\n' "$op latency [usec], ami $m" "$al" "$il" "$(ratio "$al" "$il")" "$target_lat"
      printf '%-34s %10s %10s %9s   %s\n' "$op rate [Mpps], ami $m" "$ar" "$ir" "$(ratio "$ar" "$ir")" "$target_rate"
    done
  done
}

if [[ $RXE == 1 ]]; then
  rxe_host_main
elif [[ ${1:-} == --rxe-vm ]]; then
  shift
  rxe_vm_main "$@"
else
  host_main
fi
