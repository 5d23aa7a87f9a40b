#!/usr/bin/env bash
# bench/ofi_peers.sh — ami's libfabric backend (--backend ofi) against
# libfabric's own ping-pong, fi_pingpong, on the same provider: on this host
# over each provider of PROVIDERS (shm and tcp;ofi_rxm), server pinned to
# core 0 and client to core 1; and, with --rxe, on soft-RoCE inside ONE boot
# of the test VM (tests/rxe/ami-vm): ami over verbs;ofi_rxm against ami's
# own verbs backend, perftest and fi_pingpong. Each figure is the median of
# ROUNDS interleaved runs; the ratios are what to read, since absolute
# numbers move with the machine's load.
#
# What is compared with what. fi_pingpong is a ping-pong with one message
# in flight and has no streaming mode; it reports averages over its run:
# usec/xfer is half a round trip, MB/sec is size / usec/xfer in 10^6 B/s
# (it prints both to two decimals; the latency is taken from whichever has
# more digits, both come from the same clock). So:
#   - latency: ami_send_lat's t_avg (the average, not t_typical, its
#     median) against fi_pingpong's usec/xfer; target ami/fi <= 1.10 (the
#     headline adds ami's median at 8 B, as a reference);
#   - bandwidth: ami's ping-pong bandwidth, size / ami_send_lat's t_avg,
#     against fi_pingpong's, both in MiB/s: the same measurement on both
#     sides; target ami/fi >= 0.95. ami_send_bw's streaming bandwidth (a
#     window of messages in flight) is printed next to it against the same
#     fi_pingpong figure as a reference only: a stream against a ping-pong
#     is not a like-for-like ratio;
#   - on rxe (--rxe): ami_send_bw over ofi (AMI_OFI_PROVIDER=verbs;ofi_rxm)
#     against ami_send_bw over verbs (target ofi/verbs >= 0.90) and against
#     ib_send_bw; ami_send_lat over ofi against over verbs and ib_send_lat
#     by t_typical, the median, as bench/rxe_vs_perftest.sh (averages on
#     an emulated NIC carry stalls of milliseconds), and by t_avg against
#     fi_pingpong -p "verbs;ofi_rxm" (target ofi/fi_pingpong <= 1.10).
#
# On the host, a sweep over SIZES (8, 64 KiB and 1 MiB always: the headline
# figures are the sweep's at those sizes): a headline table per provider,
# latency and bandwidth tables by size with their ratios, and two plots by
# bench/plot.sh. A run that does not end within RUN_TIMEOUT seconds is
# stopped and its figure is n/a; that tool is then not run again on that
# provider at that size or above (each such run would cost RUN_TIMEOUT), and
# the report lists what was left out. Written to OUT_DIR: ofi_peers.txt
# (everything printed), ofi_peers_lat.dat/.png, ofi_peers_bw.dat/.png; with
# --rxe: ofi_peers_rxe.txt, ofi_peers_rxe_lat.dat/.png,
# ofi_peers_rxe_bw.dat/.png.
#
# usage: bench/ofi_peers.sh [--rxe] [build-dir]
#        ROUNDS=3                        rounds
#        OUT_DIR=<build-dir>/bench-results
#        RUN_TIMEOUT=120                 seconds a run may take
#    on the host:
#        PROVIDERS="shm tcp;ofi_rxm"     libfabric providers, as fi_info names them
#        SIZES="8 64 ... 1048576"        the sweep's sizes
#        LAT_ITERS=20000                 ping-pong iterations (ami and fi_pingpong
#                                        alike) up to 512 B; above that
#        PINGPONG_BYTES=268435456        bytes per ping-pong run, each way (1000
#                                        to LAT_ITERS iterations)
#        SWEEP_BYTES=268435456           bytes per ami_send_bw run (200 to
#        RATE_ITERS=200000                 RATE_ITERS messages)
#        PORT=19400                      first TCP port (one more per run)
#    with --rxe (in the VM; it needs root and qemu, see tests/rxe/README.md):
#        SIZES="8 4096 65536" LAT_ITERS=1000 BW_ITERS=5000
#        BW_ITERS_LARGE=1000             bandwidth iterations above 4 KiB
#                                        (fi_pingpong runs LAT_ITERS, as ami_send_lat)
#        VM_TIMEOUT=3600                 seconds for everything in the VM
set -euo pipefail
cd "$(dirname "$0")/.."

# Always measured: the headline's sizes.
readonly HEAD_LAT=8 HEAD_BW="65536 1048576"
# The provider of the --rxe part, and the small job it is told to expect (rxm
# sizes its per-peer resources by FI_UNIVERSE_SIZE; the default is 256).
readonly RXE_PROVIDER="verbs;ofi_rxm" RXE_UNIVERSE=4

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "n/a"; else print v[int((NR + 1) / 2)]}'; }

declare -A samples=()
add() { [[ -n $2 ]] && samples[$1]+="$2"$'\n'; return 0; }
med() { printf '%s' "${samples[$1]:-}" | { grep . || true; } | median; }

# plabel PROVIDER: a name for columns and legends: shm, tcp-rxm, verbs-rxm.
plabel() { local p=${1//;ofi_/-}; printf '%s' "${p//;/-}"; }

# fi_lat ROW: fi_pingpong's latency [usec] from its result row, from MB/sec
# (size / latency) or usec/xfer, whichever has more digits. Its sizes read
# 1k, 1m: the size comes from the caller.
fi_lat() { awk -v s="$1" '{ if ($6 + 0 > $7 + 0 && $6 + 0 > 0) printf "%.6g\n", s / $6; else if ($7 + 0 > 0) print $7 }'; }
# bw_of SIZE < bandwidth row: MiB/s from the message rate column [Mpps],
# which keeps its digits at small sizes (ami's tools and perftest alike).
bw_of() { awk -v s="$1" '$5 + 0 > 0 {printf "%.6g\n", $5 * 1e6 * s / 1048576}'; }
# lat_of < latency row: t_avg [usec]; typ_of: t_typical, the median
# (ami's tools and perftest alike).
lat_of() { awk '$6 + 0 > 0 {print $6}'; }
typ_of() { awk '$5 + 0 > 0 {print $5}'; }

# ratio_cells A P TARGET: "ratio met" for a table row; TARGET "<= x",
# ">= x" or anything else (a reference: no verdict).
ratio_cells() {
  awk -v a="$1" -v p="$2" -v t="$3" 'BEGIN {
    if (!(a + 0 > 0 && p + 0 > 0)) { printf "%9s %5s", "n/a", (t ~ /^[<>]=/) ? "n/a" : ""; exit }
    r = a / p; split(t, g, " ")
    m = (g[1] == "<=") ? (r <= g[2] ? "yes" : "NO") : (g[1] == ">=") ? (r >= g[2] ? "yes" : "NO") : ""
    printf "%9.3f %5s", r, m }'
}
ratio() { ratio_cells "$1" "$2" x | awk '{print $1}'; }
num() { awk -v v="$1" 'BEGIN { if (v + 0 > 0) printf "%.2f", v; else printf "n/a" }'; }

# ---- on the host ------------------------------------------------------------

ensure_packages() {  # ensure_packages [rxe]
  local missing=()
  command -v fi_pingpong >/dev/null || missing+=(libfabric-bin)
  [[ ${1:-} != rxe ]] || command -v ib_send_bw >/dev/null || missing+=(perftest)
  ((${#missing[@]})) || return 0
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  echo "installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_build() {
  [[ -f "$BUILD/build.ninja" ]] || meson setup "$BUILD" >/dev/null
  meson compile -C "$BUILD" tools/ami_info tools/ami_send_lat tools/ami_send_bw ami-ofi >/dev/null
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# listening PORT: a process listens on that TCP port (ami's bootstrap,
# fi_pingpong's control connection, perftest's address exchange).
listening() {
  local hex
  hex=$(printf '%04X' "$1")
  grep -q ":$hex [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# run_pair SERVER-CMD... -- CLIENT-CMD...: the server pinned to SERVER_CPU,
# then, once it listens on PORT, the client pinned to CLIENT_CPU, each
# limited to RUN_TIMEOUT; sets OUT (the client's output) and RC (its exit
# status, 124 when it timed out). A server left waiting for a client that
# failed is stopped after 5 s.
run_pair() {
  local server=() client=() spid i
  while [[ $1 != -- ]]; do server+=("$1"); shift; done
  shift
  client=("$@")
  timeout "$((RUN_TIMEOUT + 10))" taskset -c "$SERVER_CPU" "${server[@]}" >"$WORK/server.out" 2>&1 &
  spid=$!
  for ((i = 0; i < 100; i++)); do
    listening "$PORT" || ! kill -0 "$spid" 2>/dev/null && break
    sleep 0.1
  done
  RC=0
  OUT=$(timeout "$RUN_TIMEOUT" taskset -c "$CLIENT_CPU" "${client[@]}" 2>&1) || RC=$?
  for ((i = 0; i < 50; i++)); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  PORT=$((PORT + 1))
  # A failure may be reported by either side: the server's last words too.
  ((RC == 0)) || OUT+=$'\n'"server: $(tail -2 "$WORK/server.out")"
}

declare -A hung=() transport=() failed=() failed_out=()
skipped=()

# gone KEY SIZE: this tool timed out on this provider at SIZE or below.
gone() { [[ -n ${hung[$1]:-} ]] && (($2 >= hung[$1])); }

# checked KEY SIZE: after a run (RC, OUT), note a timeout or a failure;
# false when it timed out.
checked() {
  if ((RC == 124)); then
    hung[$1]=$2
    skipped+=("$1 from $2 B up: timed out after ${RUN_TIMEOUT} s in round $round")
    echo "$1, $2 B: timed out after ${RUN_TIMEOUT} s; not run again at this size or above" >&2
    return 1
  fi
  if ((RC != 0)); then
    echo "$1, $2 B: failed ($RC): $(tail -2 <<<"$OUT" | tr '\n' ' ')" >&2
    if [[ -z ${failed[$1]:-} ]]; then
      failed[$1]="$2 B (exit status $RC, round $round)"
      failed_out[$1]=$({ grep -m3 -iE 'error|abort|terminat|what\(\)|assert|signal' <<<"$OUT" || tail -4 <<<"$OUT"; })
    fi
  fi
  return 0
}

# missing: what the tables lack and why (timeouts, failures).
missing() {
  local key
  for key in "${!failed[@]}"; do
    echo "# $key FAILED first at ${failed[$key]}; it printed:"
    sed 's/^/#   /' <<<"${failed_out[$key]}"
  done
  if ((${#skipped[@]})); then
    echo "# not measured (n/a):"
    printf '#   %s\n' "${skipped[@]}"
  fi
}

# ami TOOL PROVIDER SIZE ITERS: sets ROW to the tool's result row ("" when
# it did not run to its end).
ami() {
  local tool=$1 prov=$2 size=$3 iters=$4 key="$1 over $2" cmd
  ROW=""
  gone "$key" "$size" && return 0
  cmd=(env AMI_OFI_PROVIDER="$prov" "$BUILD/tools/$tool" --backend ofi -s "$size" -n "$iters" -p "$PORT")
  run_pair "${cmd[@]}" -- "${cmd[@]}" 127.0.0.1
  checked "$key" "$size" || return 0
  [[ -n ${transport[$prov]:-} ]] ||
    transport[$prov]=$(sed -n '/^ *Transport *:/{s/^ *Transport *: *//; s/, largest message.*//; p;}' <<<"$OUT" | head -1)
  ROW=$(awk -v s="$size" '$1 == s' <<<"$OUT")
}

# fabric PROVIDER SIZE ITERS: sets ROW to fi_pingpong's result row (the one
# after its header). A run that fails is run once more (on the next port):
# now and then fi_pingpong's shm endpoint cannot be enabled (fi_enable:
# EBUSY) and both sides stop before measuring anything.
fabric() {
  local prov=$1 size=$2 iters=$3 key="fi_pingpong -p $1" attempt
  ROW=""
  gone "$key" "$size" && return 0
  for attempt in 1 2; do
    run_pair fi_pingpong -p "$prov" -e rdm -S "$size" -I "$iters" -B "$PORT" -- \
             fi_pingpong -p "$prov" -e rdm -S "$size" -I "$iters" -P "$PORT" 127.0.0.1
    ((RC == 0 || RC == 124 || attempt == 2)) && break
    echo "$key, $size B: failed ($RC); once more" >&2
  done
  checked "$key" "$size" || return 0
  ROW=$(awk 'row { print; exit } $1 == "bytes" { row = 1 }' <<<"$OUT")
}

# Iterations at SIZE: ping-pongs (ami_send_lat and fi_pingpong alike) run
# LAT_ITERS up to 512 B and move PINGPONG_BYTES above (at least 1000);
# ami_send_bw moves SWEEP_BYTES (200 to RATE_ITERS messages).
lat_iters() {
  awk -v n="$LAT_ITERS" -v b="$PINGPONG_BYTES" -v s="$1" \
    'BEGIN { m = (s <= 512) ? n : int(b / s); if (m > n) m = n; if (m < 1000) m = 1000; print m }'
}
bw_iters() {
  awk -v b="$SWEEP_BYTES" -v r="$RATE_ITERS" -v s="$1" \
    'BEGIN { m = int(b / s); if (m > r) m = r; if (m < 200) m = 200; print m }'
}

# One round: for each size, each provider, the three runs back to back,
# the two ping-pongs in the round's order: ami first in odd rounds,
# fi_pingpong first in even ones, so that neither always follows the
# bandwidth stream of the size before (what a run follows moves it here).
one_round() {
  local size prov li bi
  for size in $ALL_SIZES; do
    li=$(lat_iters "$size") bi=$(bw_iters "$size")
    for prov in $PROVIDERS; do
      ((round % 2 == 0)) && fi_pingpong_run "$prov" "$size" "$li"
      ami ami_send_lat "$prov" "$size" "$li"
      add "lat_ami/$prov/$size" "$(lat_of <<<"$ROW")"
      add "typ_ami/$prov/$size" "$(typ_of <<<"$ROW")"
      ((round % 2 == 1)) && fi_pingpong_run "$prov" "$size" "$li"
      ami ami_send_bw "$prov" "$size" "$bi"
      add "bw_ami/$prov/$size" "$(bw_of "$size" <<<"$ROW")"
    done
  done
}

fi_pingpong_run() {  # fi_pingpong_run PROVIDER SIZE ITERATIONS
  fabric "$1" "$2" "$3"
  add "lat_fi/$1/$2" "$(fi_lat "$2" <<<"$ROW")"
}

# pp_bw SIZE LATENCY: the ping-pong bandwidth [MiB/s] of that latency [usec].
pp_bw() { awk -v s="$1" -v l="$2" 'BEGIN { if (l + 0 > 0) printf "%.6g", s / l * 1e6 / 1048576; else printf "n/a" }'; }

human() { awk -v s="$1" 'BEGIN { if (s >= 1048576) printf "%g MiB", s / 1048576; else if (s >= 1024) printf "%g KiB", s / 1024; else printf "%d B", s }'; }

hrow() {  # hrow LABEL AMI PEER TARGET
  printf '%-38s %12s %12s %s   %s\n' "$1" "$(num "$2")" "$(num "$3")" "$(ratio_cells "$2" "$3" "$4")" "$4"
}

headline() {  # headline PROVIDER
  local prov=$1 size la lf
  echo "# $prov: ami --backend ofi (AMI_OFI_PROVIDER=$prov) against fi_pingpong -p \"$prov\" -e rdm"
  echo "# ami transport: ${transport[$prov]:-(no run of ami ended)}"
  echo "# fi_pingpong is a ping-pong (one message in flight): its bandwidth is size / latency"
  printf '%-38s %12s %12s %9s %5s   %s\n' figure ami fi_pingpong ami/fi met target
  la=$(med "lat_ami/$prov/$HEAD_LAT") lf=$(med "lat_fi/$prov/$HEAD_LAT")
  hrow "latency $(human "$HEAD_LAT"), average [usec]" "$la" "$lf" "<= 1.10"
  hrow "latency $(human "$HEAD_LAT"), ami's median [usec]" "$(med "typ_ami/$prov/$HEAD_LAT")" "$lf" \
    "(reference: ami's t_typical against fi's average)"
  for size in $HEAD_BW; do
    la=$(med "lat_ami/$prov/$size") lf=$(med "lat_fi/$prov/$size")
    hrow "ping-pong bandwidth $(human "$size") [MiB/s]" "$(pp_bw "$size" "$la")" "$(pp_bw "$size" "$lf")" ">= 0.95"
  done
  for size in $HEAD_BW; do
    lf=$(med "lat_fi/$prov/$size")
    hrow "ami_send_bw stream $(human "$size") [MiB/s]" "$(med "bw_ami/$prov/$size")" "$(pp_bw "$size" "$lf")" \
      "(reference: a stream against a ping-pong)"
  done
}

# by_size: latency and bandwidth by size, with the ratios, every provider;
# the figures alone (no ratios) go to the .dat files plot.sh draws.
by_size() {
  local size prov la lf ba pa pf
  local lat_dat=$OUT_DIR/ofi_peers_lat.dat bw_dat=$OUT_DIR/ofi_peers_bw.dat
  echo "# latency by size [usec]: ami_send_lat t_avg against fi_pingpong usec/xfer; ami/fi target <= 1.10"
  printf '%-9s' bytes
  for prov in $PROVIDERS; do printf ' %12s %12s %8s' "ami_$(plabel "$prov")" "fi_$(plabel "$prov")" ami/fi; done
  echo
  printf 'bytes' >"$lat_dat"
  for prov in $PROVIDERS; do printf ' ami_ofi_%s fi_pingpong_%s' "$(plabel "$prov")" "$(plabel "$prov")"; done >>"$lat_dat"
  echo >>"$lat_dat"
  for size in $ALL_SIZES; do
    printf '%-9s' "$size"
    printf '%s' "$size" >>"$lat_dat"
    for prov in $PROVIDERS; do
      la=$(med "lat_ami/$prov/$size") lf=$(med "lat_fi/$prov/$size")
      printf ' %12s %12s %8s' "$(num "$la")" "$(num "$lf")" "$(ratio "$la" "$lf")"
      printf ' %s %s' "$la" "$lf" >>"$lat_dat"
    done
    echo
    echo >>"$lat_dat"
  done
  echo
  echo "# bandwidth by size [MiB/s]: ping-pong (pp, size / t_avg) ami against fi_pingpong, target ami/fi >= 0.95;"
  echo "# stream: ami_send_bw, a window in flight (reference; stream/fi against fi_pingpong's ping-pong)"
  printf '%-9s' bytes
  for prov in $PROVIDERS; do
    printf ' %12s %12s %8s %12s %9s' "pp_ami_$(plabel "$prov")" "pp_fi" ami/fi stream stream/fi
  done
  echo
  printf 'bytes' >"$bw_dat"
  for prov in $PROVIDERS; do
    printf ' ami_stream_%s ami_pingpong_%s fi_pingpong_%s' "$(plabel "$prov")" "$(plabel "$prov")" "$(plabel "$prov")"
  done >>"$bw_dat"
  echo >>"$bw_dat"
  for size in $ALL_SIZES; do
    printf '%-9s' "$size"
    printf '%s' "$size" >>"$bw_dat"
    for prov in $PROVIDERS; do
      pa=$(pp_bw "$size" "$(med "lat_ami/$prov/$size")") pf=$(pp_bw "$size" "$(med "lat_fi/$prov/$size")")
      ba=$(med "bw_ami/$prov/$size")
      printf ' %12s %12s %8s %12s %9s' "$(num "$pa")" "$(num "$pf")" "$(ratio "$pa" "$pf")" \
        "$(num "$ba")" "$(ratio "$ba" "$pf")"
      printf ' %s %s %s' "$ba" "$pa" "$pf" >>"$bw_dat"
    done
    echo
    echo >>"$bw_dat"
  done
}

report() {
  local prov
  echo "# ami's ofi backend against fi_pingpong; server on core $SERVER_CPU, client on core $CLIENT_CPU"
  echo "# $ROUNDS interleaved rounds, medians; $("$BUILD/tools/ami_info" | head -1 | sed 's/^# //'), $(fi_info --version | head -1)"
  for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round" >&2
    one_round
  done
  for prov in $PROVIDERS; do
    echo
    headline "$prov"
  done
  echo
  by_size
  if ((${#skipped[@]} + ${#failed[@]})); then
    echo
    missing
  fi
  echo
  rounds
}

# Every figure's runs in round order: where a median fell between modes
# (this machine's runs fall into one of two, whole runs at a time), the
# figures show it.
rounds() {
  local key
  echo "# the rounds, in order (latency: usec; bw: MiB/s), fi_pingpong first in even rounds"
  for key in $(printf '%s\n' "${!samples[@]}" | sort -t/ -k2,2 -k3,3n -k1,1); do
    printf '%-28s %s\n' "$key" "$(printf '%s' "${samples[$key]}" | tr '\n' ' ')"
  done
}

host_main() {
  SIZES=${SIZES-8 64 512 4096 32768 262144 1048576}
  LAT_ITERS=${LAT_ITERS:-20000}
  PINGPONG_BYTES=${PINGPONG_BYTES:-268435456}
  SWEEP_BYTES=${SWEEP_BYTES:-268435456}
  RATE_ITERS=${RATE_ITERS:-200000}
  PROVIDERS=${PROVIDERS:-shm tcp;ofi_rxm}
  PORT=${PORT:-19400}
  SERVER_CPU=0
  CLIENT_CPU=$(( $(nproc) > 1 ? 1 : 0 ))
  # shellcheck disable=SC2086  # the lists split on blanks
  ALL_SIZES=$(printf '%s\n' $SIZES $HEAD_LAT $HEAD_BW | sort -n -u | tr '\n' ' ')
  ensure_packages
  ensure_build
  # A provider libfabric does not offer here is left out, and said so.
  local prov offered=()
  for prov in $PROVIDERS; do
    if fi_info -p "$prov" -t FI_EP_RDM >/dev/null 2>&1; then offered+=("$prov"); else
      echo "# provider $prov: not offered by libfabric here (fi_info -p \"$prov\" -t FI_EP_RDM finds none); left out" >&2
    fi
  done
  ((${#offered[@]})) || { echo "no provider of PROVIDERS ($PROVIDERS) is offered by libfabric here" >&2; return 1; }
  PROVIDERS=${offered[*]}
  mkdir -p "$OUT_DIR"
  rm -f "$OUT_DIR"/ofi_peers_{lat,bw}.{dat,png}
  report | tee "$OUT_DIR/ofi_peers.txt"
  bench/plot.sh --pairs -t "ami over libfabric vs fi_pingpong: latency (average)" -y "latency [usec]" \
    "$OUT_DIR/ofi_peers_lat.dat" "$OUT_DIR/ofi_peers_lat.png" || true
  bench/plot.sh -t "ami over libfabric vs fi_pingpong: bandwidth (ping-pong; ami stream for reference)" \
    -y "bandwidth [MiB/s]" "$OUT_DIR/ofi_peers_bw.dat" "$OUT_DIR/ofi_peers_bw.png" || true
}

# ---- --rxe: on the host, the same script inside the VM ----------------------

rxe_host_main() {
  SIZES=${SIZES-8 4096 65536}
  LAT_ITERS=${LAT_ITERS:-1000}
  BW_ITERS=${BW_ITERS:-5000}
  BW_ITERS_LARGE=${BW_ITERS_LARGE:-1000}
  local build out rc=0
  ensure_packages rxe
  ensure_build
  build=$(cd "$BUILD" && pwd)
  mkdir -p "$OUT_DIR"
  out=$(cd "$OUT_DIR" && pwd)
  rm -f "$out"/ofi_peers_rxe_{lat,bw}.{dat,png}
  # The VM passes only AMI_* variables on: the settings go as arguments. It
  # writes the .dat files itself, into the shared OUT_DIR.
  tests/rxe/ami-vm --timeout "${VM_TIMEOUT:-3600}" --share "$PWD" --share "$build" --share "$out" -- \
    "$PWD/bench/ofi_peers.sh" "$build" "$out" "$ROUNDS" "$RUN_TIMEOUT" "$LAT_ITERS" "$BW_ITERS" \
    "$BW_ITERS_LARGE" "$SIZES" | tee "$out/ofi_peers_rxe.txt" || rc=$?
  [[ ! -s $out/ofi_peers_rxe_bw.dat ]] ||
    bench/plot.sh -t "soft-RoCE (rxe0): send bandwidth, ami over ofi ($RXE_PROVIDER) vs verbs vs perftest" \
      -y "bandwidth, average [MiB/s]" "$out/ofi_peers_rxe_bw.dat" "$out/ofi_peers_rxe_bw.png" || true
  [[ ! -s $out/ofi_peers_rxe_lat.dat ]] ||
    bench/plot.sh -t "soft-RoCE (rxe0): send latency, ami over ofi vs verbs vs perftest (median); vs fi_pingpong (average)" \
      -y "latency [usec]" "$out/ofi_peers_rxe_lat.dat" "$out/ofi_peers_rxe_lat.png" || true
  return "$rc"
}

# ---- --rxe: in the VM ---------------------------------------------------------

# vm_ami TOOL ofi|verbs SIZE ITERS: sets ROW, both sides from one command
# (--local), as bench/rxe_vs_perftest.sh runs them.
vm_ami() {
  local tool=$1 backend=$2 size=$3 iters=$4 key="$1 over $2"
  ROW=""
  gone "$key" "$size" && return 0
  RC=0
  if [[ $backend == ofi ]]; then
    OUT=$(AMI_OFI_PROVIDER=$RXE_PROVIDER timeout "$RUN_TIMEOUT" "$BUILD/tools/$tool" --backend ofi --local \
          -s "$size" -n "$iters" -p "$PORT" 2>&1) || RC=$?
    [[ -n ${transport[ofi]:-} ]] || transport[ofi]=$(sed -n '/^ *Transport *:/{s/^ *Transport *: *//; s/, largest message.*//; p;}' <<<"$OUT" | head -1)
  else
    OUT=$(AMI_VERBS_CM=off timeout "$RUN_TIMEOUT" "$BUILD/tools/$tool" --local -d "$device" -x "$RXE_GID_INDEX" \
          -s "$size" -n "$iters" -p "$PORT" 2>&1) || RC=$?
  fi
  PORT=$((PORT + 1))
  checked "$key" "$size" || return 0
  ROW=$(awk -v s="$size" '$1 == s' <<<"$OUT")
}

# vm_perftest TOOL SIZE ITERS: sets ROW to the client's result row.
vm_perftest() {
  local tool=$1 size=$2 iters=$3 extra=() out=/tmp/bench-perftest
  [[ $tool == *_lat ]] && extra=(-F)  # no cpufreq in the VM: do not refuse over it
  perftest_pair "$out" "$PORT" "$RUN_TIMEOUT" "$tool" -d "$device" -x "$RXE_GID_INDEX" -s "$size" \
    -n "$iters" "${extra[@]}" || { RC=1 OUT=$(cat "$out.client"); checked "$tool" "$size"; }
  PORT=$((PORT + 5))
  ROW=$(awk -v s="$size" '$1 == s' "$out.client")
}

# vm_fabric SIZE ITERS: fi_pingpong over RXE_PROVIDER, server and client in
# the VM, the client once the server listens; sets ROW.
vm_fabric() {
  local size=$1 iters=$2 key="fi_pingpong -p $RXE_PROVIDER" spid ip
  ROW=""
  gone "$key" "$size" && return 0
  ip=$(rxe_server_ip)
  timeout "$((RUN_TIMEOUT + 10))" fi_pingpong -p "$RXE_PROVIDER" -e rdm -S "$size" -I "$iters" -B "$PORT" \
    >/dev/null 2>&1 &
  spid=$!
  wait_listen "$PORT" "$spid" || true
  RC=0
  OUT=$(timeout "$RUN_TIMEOUT" fi_pingpong -p "$RXE_PROVIDER" -e rdm -S "$size" -I "$iters" -P "$PORT" "$ip" 2>&1) ||
    RC=$?
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  PORT=$((PORT + 1))
  checked "$key" "$size" || return 0
  ROW=$(awk 'row { print; exit } $1 == "bytes" { row = 1 }' <<<"$OUT")
}

vm_round() {
  local size iters
  for size in $SIZES; do
    iters=$BW_ITERS
    ((size > 4096)) && iters=$BW_ITERS_LARGE
    if ((ofi_ok)); then vm_ami ami_send_bw ofi "$size" "$iters"; add "bw_ofi/$size" "$(bw_of "$size" <<<"$ROW")"; fi
    vm_ami ami_send_bw verbs "$size" "$iters"; add "bw_verbs/$size" "$(bw_of "$size" <<<"$ROW")"
    vm_perftest ib_send_bw "$size" "$iters"; add "bw_perf/$size" "$(bw_of "$size" <<<"$ROW")"
    iters=$LAT_ITERS
    if ((ofi_ok)); then
      vm_ami ami_send_lat ofi "$size" "$iters"
      add "lat_ofi/$size" "$(typ_of <<<"$ROW")"
      add "avg_ofi/$size" "$(lat_of <<<"$ROW")"
    fi
    vm_ami ami_send_lat verbs "$size" "$iters"; add "lat_verbs/$size" "$(typ_of <<<"$ROW")"
    vm_perftest ib_send_lat "$size" "$iters"; add "lat_perf/$size" "$(typ_of <<<"$ROW")"
    if ((ofi_ok)); then vm_fabric "$size" "$iters"; add "lat_fi/$size" "$(fi_lat "$size" <<<"$ROW")"; fi
  done
}

vm_main() {
  BUILD=$1 OUT_DIR=$2 ROUNDS=$3 RUN_TIMEOUT=$4 LAT_ITERS=$5 BW_ITERS=$6 BW_ITERS_LARGE=$7 SIZES=$8
  device=${AMI_NET_DEVICES:-rxe0:1}
  device=${device%%:*}
  PORT=19400
  export FI_UNIVERSE_SIZE=$RXE_UNIVERSE
  . tests/rxe/perftest_pair.sh
  local size mo mv mp ma mf bw_dat=$OUT_DIR/ofi_peers_rxe_bw.dat lat_dat=$OUT_DIR/ofi_peers_rxe_lat.dat
  echo "# ami over ofi ($RXE_PROVIDER, FI_UNIVERSE_SIZE=$RXE_UNIVERSE) vs ami over verbs vs perftest on $device"
  echo "# (soft-RoCE in a TCG VM), GID index $RXE_GID_INDEX; $ROUNDS interleaved rounds, medians"
  ofi_ok=1
  if ! fi_info -p "$RXE_PROVIDER" -t FI_EP_RDM >/dev/null 2>&1; then
    ofi_ok=0
    echo "# $RXE_PROVIDER: NOT offered by libfabric in the VM (fi_info -p \"$RXE_PROVIDER\" -t FI_EP_RDM finds"
    echo "# none): no ofi figures below (n/a), only ami over verbs and perftest"
  fi
  for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round" >&2
    vm_round
  done
  ((ofi_ok == 0)) || echo "# ami over ofi transport: ${transport[ofi]:-(no run of ami over ofi ended)}"
  missing
  echo
  echo "# send bandwidth, average [MiB/s]: ami_send_bw over ofi and over verbs, ib_send_bw"
  printf '%-8s %10s %10s %10s | %9s %9s %10s %5s   %s\n' bytes ami_ofi ami_verbs perftest ofi/verbs ofi/perf \
    verbs/perf met target
  echo "bytes ami_ofi ami_verbs ib_send_bw" >"$bw_dat"
  for size in $SIZES; do
    mo=$(med "bw_ofi/$size") mv=$(med "bw_verbs/$size") mp=$(med "bw_perf/$size")
    printf '%-8s %10s %10s %10s | %9s %9s %10s %5s   %s\n' "$size" "$(num "$mo")" "$(num "$mv")" "$(num "$mp")" \
      "$(ratio "$mo" "$mv")" "$(ratio "$mo" "$mp")" "$(ratio "$mv" "$mp")" \
      "$(ratio_cells "$mo" "$mv" ">= 0.90" | awk '{print $2}')" "ofi/verbs >= 0.90"
    echo "$size $mo $mv $mp" >>"$bw_dat"
  done
  # The median is what bench/rxe_vs_perftest.sh compares: averages on an
  # emulated NIC carry stalls of milliseconds. fi_pingpong has only its
  # average, so ami's average is set against it.
  echo
  echo "# send latency [usec]: t_typical (median) of ami_send_lat over ofi and over verbs, ib_send_lat;"
  echo "# then ami_send_lat's t_avg over ofi against fi_pingpong -p \"$RXE_PROVIDER\" usec/xfer (an average)"
  printf '%-8s %10s %10s %10s | %9s %9s %10s | %10s %11s %8s %5s   %s\n' bytes ami_ofi ami_verbs perftest \
    ofi/verbs ofi/perf verbs/perf ofi_avg fi_pingpong ofi/fi met target
  echo "bytes ami_ofi_median ami_verbs_median ib_send_lat_median ami_ofi_average fi_pingpong_average" >"$lat_dat"
  for size in $SIZES; do
    mo=$(med "lat_ofi/$size") mv=$(med "lat_verbs/$size") mp=$(med "lat_perf/$size")
    ma=$(med "avg_ofi/$size") mf=$(med "lat_fi/$size")
    printf '%-8s %10s %10s %10s | %9s %9s %10s | %10s %11s %8s %5s   %s\n' "$size" "$(num "$mo")" "$(num "$mv")" \
      "$(num "$mp")" "$(ratio "$mo" "$mv")" "$(ratio "$mo" "$mp")" "$(ratio "$mv" "$mp")" "$(num "$ma")" "$(num "$mf")" \
      "$(ratio "$ma" "$mf")" "$(ratio_cells "$ma" "$mf" "<= 1.10" | awk '{print $2}')" "ofi/fi <= 1.10"
    echo "$size $mo $mv $mp $ma $mf" >>"$lat_dat"
  done
}

# ---- main ----------------------------------------------------------------------

if [[ ${RXE_VM:-} == 1 ]]; then
  vm_main "$@"
  exit
fi
rxe=0
if [[ ${1:-} == --rxe ]]; then rxe=1; shift; fi
BUILD=${1:-build}
ROUNDS=${ROUNDS:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
if ((rxe)); then rxe_host_main; else host_main; fi
