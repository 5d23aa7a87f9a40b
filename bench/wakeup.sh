#!/usr/bin/env bash
# bench/wakeup.sh — what sleeping costs (docs/DESIGN.md, "Event-driven
# progress"): 8-byte ping-pong latency with both sides asleep between
# messages, ami (ami_send_lat -e: each side sleeps on its context's
# event_fd() whenever an advance finds nothing) against UCX's
# (ucx_perftest -t ucp_am_lat -E sleep, UCX_TLS=sm) in the same run, with
# ami busy-polling (and UCX's -E poll) beside them for reference; then the
# CPU time each side of a connected, idle ami pair (tools/ami_rpc, driven
# by Asio, asleep) uses over IDLE_S seconds, read from /proc/PID/stat.
# Runs alternate, ROUNDS rounds; the figures are medians of the rounds'
# medians (t_typical; UCX's 50th percentile), one-way (half a round trip)
# in usec. Each side is pinned to its own core (ami: --local does it; UCX:
# -c 0 and -c 1).
#
# How often each really sleeps decides these figures, so each row also
# gives its sleeps per round trip: the voluntary context switches of both
# sides (getrusage of the processes run) over the iterations. UCX's -E
# sleep sleeps only when a ucp_worker_progress() made no progress at all,
# and while its peer is busy it nearly always finds some (or
# ucp_worker_arm says busy): its ping-pong sleeps in far fewer than one
# round trip in ten here. ami's own way to wait, ami::wait_until,
# busy-polls 50 us after the last event before it sleeps; ami -e --spin
# SPIN_US (default those 50 us) is that, the row to compare (the
# sleep-mode target's). ami -e --spin 0 sleeps whenever one advance()
# finds nothing, before nearly every message: what a wake-up itself costs.
#
# Targets: sleep latency ami -e --spin SPIN_US / UCX -E sleep <= 1.00, at
# no more sleeps per round trip; idle CPU < 1% of a core per side;
# busy-poll latency within 3% of the baseline's (BASELINE=<build-dir>, an
# earlier tree built the same way, runs in the same rounds).
#
# Waiting that yields: the barrier, 8 B and 1 MiB allreduce at 4 and 8 tasks
# on 2 cores against Open MPI's, by bench/coll_vs_mpi.sh (COLL_ROUNDS
# interleaved rounds, its report in OUT_DIR/wakeup_coll/); target <= 1.10.
#
# --rxe: the same inside the soft-RoCE VM (tests/rxe/ami-vm): ami_send_lat
# -e over verbs on rxe0 against ib_send_lat -e (perftest's sleep on its
# completion channel), and both busy-polling.
#
# Written to OUT_DIR: wakeup.txt (the table and the rounds) and wakeup.dat
# (a row per round: the latencies side by side); wakeup_rxe.* with --rxe.
# ucx_perftest comes from Debian's ucx-utils, installed when missing.
#
# usage: bench/wakeup.sh [--rxe] [build-dir]
#        ROUNDS=5 ITERS=20000 IDLE_S=10 SPIN_US=50 OUT_DIR=<build-dir>/bench-results
#        BASELINE=<build-dir>
#        COLL_ROUNDS=21                  the collectives' rounds (0: not run)
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
ITERS=${ITERS:-20000}
IDLE_S=${IDLE_S:-10}
SPIN_US=${SPIN_US:-50}
BASELINE=${BASELINE:-}
COLL_ROUNDS=${COLL_ROUNDS:-21}
SIZE=8
PORT=${PORT:-19300}
RUN_TIMEOUT=300

. bench/rounds.sh

# "${counted[@]}" FILE CMD...: runs CMD; writes to FILE the voluntary
# context switches of the processes it ran and waited for (their sleeps)
counted=(python3 -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_nvcsw)
sys.exit(r.returncode)')
CS=$(mktemp -d)
trap 'rm -rf "$CS"' EXIT
# sleeps SERIES SETUP FILES...: adds to SERIES the switches in FILES per
# round trip, less SETUP (what starting and wiring up the pair takes)
sleeps() {
  local series=$1 setup=$2
  shift 2
  add "$series" "$(cat "$@" 2>/dev/null | awk -v n="$ITERS" -v s="$setup" '{t += $1} END {if (NR) {v = (t - s) / n; printf "%.3f", (v > 0 ? v : 0)}}')"
}
# setup_sleeps ami|ucx -> the switches of a run of 10 iterations
setup_sleeps() {
  local iters=$ITERS
  ITERS=10
  if [[ $1 == ami ]]; then
    ami_lat "$BUILD" -e --spin 0 >/dev/null
    cat "$CS/ami"
  else
    ucx_lat sleep >/dev/null
    cat "$CS"/ucx.* | awk '{t += $1} END {print t}'
  fi
  ITERS=$iters
}

# ami_lat BUILD ARGS... -> t_typical of ami_send_lat's row for SIZE, to the
# nanosecond (its JSON report: the table's two decimals are 6% of a busy
# 8 B ping-pong here, and the baseline check is for 3%); both sides' sleeps
# in $CS/ami
ami_lat() {
  local build=$1 out
  shift
  rm -f "$CS/ami.json"
  out=$(timeout "$RUN_TIMEOUT" "${counted[@]}" "$CS/ami" "$build/tools/ami_send_lat" --local -s "$SIZE" -n "$ITERS" \
        -p "$PORT" --out_json --out_json_file="$CS/ami.json" "$@" 2>&1) ||
    echo "ami_send_lat $* failed: $(tail -3 <<<"$out")" >&2
  PORT=$((PORT + 1))
  python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    if r["bytes"] == int(sys.argv[2]): print("%.3f" % r["t_typical"])' "$CS/ami.json" "$SIZE" 2>/dev/null ||
    awk -v s="$SIZE" '$1 == s && NF >= 5 {print $5}' <<<"$out"
}

# ---- on the host --------------------------------------------------------------

# ucx_lat MODE -> UCX's 50th percentile, one way, over shared memory; both
# sides' sleeps in $CS/ucx.*
ucx_lat() {
  local mode=$1 out spid
  UCX_TLS=sm timeout "$RUN_TIMEOUT" "${counted[@]}" "$CS/ucx.server" ucx_perftest -t ucp_am_lat -E "$mode" -s "$SIZE" \
    -n "$ITERS" -w 1000 -p "$PORT" -c 0 -f >/dev/null 2>&1 &
  spid=$!
  sleep 0.5
  out=$(UCX_TLS=sm timeout "$RUN_TIMEOUT" "${counted[@]}" "$CS/ucx.client" ucx_perftest -t ucp_am_lat -E "$mode" -s "$SIZE" \
        -n "$ITERS" -w 1000 -p "$PORT" -c 1 -f localhost 2>&1) || echo "ucx_perftest -E $mode failed: $(tail -3 <<<"$out")" >&2
  wait "$spid" || true
  PORT=$((PORT + 1))
  # (-f: one row, iterations then the 50th percentile)
  awk '$1 ~ /^[0-9]+$/ && NF >= 8 {print $2; exit}' <<<"$out"
}

# cpu_ticks PID -> utime + stime of the process, in clock ticks
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# idle_cpu -> "server% client%": a connected ami_rpc pair, both asleep in
# the pause half-way through (after one request), over IDLE_S seconds.
idle_cpu() {
  local spid cpid s0 c0 s1 c1 hz
  hz=$(getconf CLK_TCK)
  AMI_JOB_KEY=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  export AMI_JOB_KEY
  "$BUILD/tools/ami_rpc" -p "$PORT" >/dev/null &
  spid=$!
  "$BUILD/tools/ami_rpc" -p "$PORT" -n 2 --idle-ms $(((IDLE_S + 4) * 1000)) 127.0.0.1 >/dev/null &
  cpid=$!
  PORT=$((PORT + 1))
  sleep 2  # connected, one request answered, both asleep
  s0=$(cpu_ticks "$spid") c0=$(cpu_ticks "$cpid")
  sleep "$IDLE_S"
  s1=$(cpu_ticks "$spid") c1=$(cpu_ticks "$cpid")
  wait "$cpid" || echo "ami_rpc client failed" >&2
  wait "$spid" || echo "ami_rpc server failed" >&2
  awk -v s=$((s1 - s0)) -v c=$((c1 - c0)) -v hz="$hz" -v t="$IDLE_S" \
    'BEGIN { printf "%.3f %.3f\n", 100 * s / hz / t, 100 * c / hz / t }'
}

host_main() {
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
  meson compile -C "$BUILD" tools/ami_send_lat tools/ami_rpc >/dev/null
  if [[ -n $BASELINE ]]; then
    [[ -f "$BASELINE/build.ninja" ]] || meson setup "$BASELINE" >/dev/null
    meson compile -C "$BASELINE" tools/ami_send_lat >/dev/null
  fi
  ensure_ucx
  mkdir -p "$OUT_DIR"
  local txt=$OUT_DIR/wakeup.txt dat=$OUT_DIR/wakeup.dat r ami_setup ucx_setup
  {
    echo "# 8 B ping-pong on this host, both sides pinned; $ROUNDS interleaved rounds of $ITERS iterations;"
    echo "# one-way latency [usec]: medians of ami's t_typical and UCX's 50th percentile (UCX_TLS=sm)"
    printf '%s\n' "round ami_spin ucx_sleep ami_sleep ami_busy ucx_poll${BASELINE:+ base_busy} ami_spin_sleeps ucx_sleeps ami_sleep_sleeps" >"$dat"
    for ((r = 1; r <= ROUNDS; r++)); do
      ami_setup=$(setup_sleeps ami) ucx_setup=$(setup_sleeps ucx)
      add ami_spin "$(ami_lat "$BUILD" -e --spin "$SPIN_US")"
      sleeps ami_spin_cs "$ami_setup" "$CS/ami"
      add ucx_sleep "$(ucx_lat sleep)"
      sleeps ucx_sleep_cs "$ucx_setup" "$CS"/ucx.*
      add ami_sleep "$(ami_lat "$BUILD" -e --spin 0)"
      sleeps ami_sleep_cs "$ami_setup" "$CS/ami"
      add ami_busy "$(ami_lat "$BUILD")"
      add ucx_poll "$(ucx_lat poll)"
      [[ -z $BASELINE ]] || add base_busy "$(ami_lat "$BASELINE")"
      echo "# round $r: ami -e --spin $SPIN_US $(last ami_spin) ($(last ami_spin_cs) sleeps/rt)," \
        "ucx -E sleep $(last ucx_sleep) ($(last ucx_sleep_cs)), ami -e --spin 0 $(last ami_sleep) ($(last ami_sleep_cs))," \
        "ami busy $(last ami_busy), ucx -E poll $(last ucx_poll)${BASELINE:+, baseline busy $(last base_busy)}"
      printf '%s\n' "$r $(last ami_spin) $(last ucx_sleep) $(last ami_sleep) $(last ami_busy) $(last ucx_poll)${BASELINE:+ $(last base_busy)} $(last ami_spin_cs) $(last ucx_sleep_cs) $(last ami_sleep_cs)" >>"$dat"
    done
    local as us ab up bb sp cpu
    as=$(med ami_sleep) us=$(med ucx_sleep) ab=$(med ami_busy) up=$(med ucx_poll) bb=$(med base_busy) sp=$(med ami_spin)
    echo "# idle: a connected ami_rpc pair (Asio, asleep), CPU over $IDLE_S s from /proc/PID/stat"
    cpu=$(idle_cpu)
    echo "# sleeps/rt: voluntary context switches of both sides per round trip, less those of a run of 10 (medians)"
    printf '%-38s %10s %10s %9s   %s\n' measure ami other ami/other target
    printf '%-38s %10s %10s %9s   %s\n' "8 B latency, sleep mode [usec]" "$sp" "$us" "$(ratio "$sp" "$us")" \
      "<=1.00 (ami -e --spin $SPIN_US / ucx -E sleep)"
    printf '%-38s %10s %10s %9s   %s\n' "  sleeps per round trip" "$(med ami_spin_cs)" "$(med ucx_sleep_cs)" \
      "$(awk -v a="$(med ami_spin_cs)" -v b="$(med ucx_sleep_cs)" 'BEGIN { print (a + 0 <= b + 0 ? "fewer" : "more") }')" \
      "ami no more often than UCX"
    printf '%-38s %10s %10s %9s   %s\n' "8 B latency, -e --spin 0 [usec]" "$as" "$us" "$(ratio "$as" "$us")" \
      "(a sleep at every gap: $(med ami_sleep_cs) sleeps/rt)"
    printf '%-38s %10s %10s %9s   %s\n' "8 B latency, busy-poll [usec]" "$ab" "$up" "$(ratio "$ab" "$up")" "(ucx -E poll, reference)"
    [[ -z $BASELINE ]] ||
      printf '%-38s %10s %10s %9s   %s\n' "8 B busy-poll vs baseline [usec]" "$ab" "$bb" "$(ratio "$ab" "$bb")" "0.97..1.03"
    read -r cs cc <<<"$cpu"
    printf '%-38s %10s %10s %9s   %s\n' "idle CPU, server [% of a core]" "$cs" "-" "-" "<1"
    printf '%-38s %10s %10s %9s   %s\n' "idle CPU, client [% of a core]" "$cc" "-" "-" "<1"
    ((COLL_ROUNDS == 0)) || oversubscribed_collectives
  } | tee "$txt"
}

# The oversubscribed rows of bench/coll_vs_mpi.sh's table ("N  name...  ami
# MPI ratio  oversubscribed (...)") as rows of this one.
oversubscribed_collectives() {
  local out
  out=$(SIZES="4 8" BYTES="" ROUNDS=$COLL_ROUNDS OUT_DIR="$OUT_DIR/wakeup_coll" bench/coll_vs_mpi.sh "$BUILD" 2>/dev/null) || {
    echo "# oversubscribed collectives: bench/coll_vs_mpi.sh failed"
    return 0
  }
  echo "# oversubscribed collectives: bench/coll_vs_mpi.sh, $COLL_ROUNDS interleaved rounds; ami yields when idle, as Open MPI does"
  awk '$1 ~ /^[0-9]+$/ {
         k = 0
         for (i = 1; i <= NF; i++) if ($i == "oversubscribed") { k = i; break }
         if (k < 6) next
         name = $2; for (i = 3; i <= k - 4; i++) name = name " " $i
         printf "%-44s %10s %10s %9s   %s\n", $1 " tasks on 2 cores, " name " [usec]", $(k - 3), $(k - 2), $(k - 1), "<=1.10 (Open MPI, btl vader)"
       }' <<<"$out"
}

# ---- --rxe: on the host, then in the VM ----------------------------------------

rxe_host_main() {
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
  meson compile -C "$BUILD" tools/ami_send_lat >/dev/null
  local build
  build=$(cd "$BUILD" && pwd)
  mkdir -p "$OUT_DIR"
  # The VM passes only AMI_* variables on: the settings go as arguments.
  tests/rxe/ami-vm --timeout 3000 --share "$PWD" --share "$build" -- "$PWD/bench/wakeup.sh" --rxe "$build" \
    "$ROUNDS" "$ITERS" | tee "$OUT_DIR/wakeup_rxe.txt"
}

rxe_vm_main() {
  BUILD=$1 ROUNDS=$2 ITERS=$3
  local device=${AMI_NET_DEVICES:-rxe0:1} r out=/tmp/bench-wakeup
  device=${device%%:*}
  . tests/rxe/perftest_pair.sh
  ib_lat() {  # ib_send_lat [-e] -> t_typical
    perftest_pair "$out" "$PORT" "$RUN_TIMEOUT" ib_send_lat -d "$device" -x "$RXE_GID_INDEX" -s "$SIZE" \
      -n "$ITERS" -F "$@" || echo "ib_send_lat $* failed: $(tail -1 "$out.client")" >&2
    PORT=$((PORT + 3))
    awk -v s="$SIZE" '$1 == s {print $5}' "$out.client"
  }
  echo "# 8 B ping-pong over $device (soft-RoCE in a TCG VM), $ROUNDS interleaved rounds of $ITERS; t_typical [usec]"
  for ((r = 1; r <= ROUNDS; r++)); do
    add ami_sleep "$(AMI_VERBS_CM=off ami_lat "$BUILD" -e -d "$device" -x "$RXE_GID_INDEX")"
    add ib_sleep "$(ib_lat -e)"
    add ami_busy "$(AMI_VERBS_CM=off ami_lat "$BUILD" -d "$device" -x "$RXE_GID_INDEX")"
    add ib_busy "$(ib_lat)"
    echo "# round $r: ami -e $(last ami_sleep), ib_send_lat -e $(last ib_sleep), ami busy $(last ami_busy)," \
      "ib_send_lat $(last ib_busy)"
  done
  local as is ab ib
  as=$(med ami_sleep) is=$(med ib_sleep) ab=$(med ami_busy) ib=$(med ib_busy)
  printf '%-30s %10s %12s %9s   %s\n' measure ami ib_send_lat ami/ib target
  printf '%-30s %10s %12s %9s   %s\n' "8 B latency, sleeping" "$as" "$is" "$(ratio "$as" "$is")" "<=1.00"
  printf '%-30s %10s %12s %9s   %s\n' "8 B latency, busy-poll" "$ab" "$ib" "$(ratio "$ab" "$ib")" "(reference)"
}

if [[ ${RXE_VM:-} == 1 ]]; then
  rxe_vm_main "$@"
elif ((RXE)); then
  rxe_host_main
else
  host_main
fi
