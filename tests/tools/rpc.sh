#!/bin/bash
# ami_rpc (tools/ami_rpc.cpp): an Asio-driven echo server and its clients
# as separate processes over shm (and once over libfabric's
# tcp;ofi_rxm, asleep on its CQ's wait descriptor). Every request is echoed byte for byte,
# with io_context on 1 and on 4 threads, one client and two, small
# requests and ones of several packets; a client that pauses half-way
# leaves both sides asleep, so the server uses a small part of a core over
# the run (a busy-polling server would use all of its time); bad command
# lines are refused.
# usage: rpc.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: rpc.sh BUILD_DIR}
rpc=$build/tools/ami_rpc
failed=()
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# session NAME SERVER_CPU_MAX_PERCENT ARGS...: the server and every client
# (--clients, default 1) must succeed; every client must see only right
# echoes; with a limit, the server's CPU share of its run must stay below it.
session() {
  local name=$1 cpu_max=$2 port clients=1 pids=() rc=0 k
  shift 2
  rm -f "$scratch"/*
  port=$(free_port)
  for ((k = 1; k <= $#; k++)); do
    [[ ${!k} == -c ]] && { local n=$((k + 1)); clients=${!n}; }
  done
  export AMI_JOB_KEY
  AMI_JOB_KEY=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  timeout 120 "$rpc" -p "$port" "$@" >"$scratch/server" 2>&1 &
  local server=$!
  for ((k = 1; k <= clients; k++)); do
    timeout 120 "$rpc" -p "$port" -r "$k" "$@" 127.0.0.1 >"$scratch/client$k" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  wait "$server" || rc=$?
  if ((rc != 0)); then
    echo "FAIL: $name: exit status $rc"; cat "$scratch"/server "$scratch"/client*; failed+=("$name"); return
  fi
  for ((k = 1; k <= clients; k++)); do
    if ! grep -q "^# client $k: .* 0 wrong echoes" "$scratch/client$k"; then
      echo "FAIL: $name: client $k"; cat "$scratch/client$k"; failed+=("$name"); return
    fi
  done
  if [[ $cpu_max != - ]]; then
    local share
    share=$(sed -n 's/^# server cpu: .*(\([0-9.]*\)%)$/\1/p' "$scratch/server")
    if [[ -z $share ]] || ! awk -v s="$share" -v m="$cpu_max" 'BEGIN { exit !(s < m) }'; then
      echo "FAIL: $name: the server used ${share:-?}% of a core (at most $cpu_max% expected of one asleep)"
      cat "$scratch/server"; failed+=("$name"); return
    fi
  fi
  echo "ok: $name: $(grep -h '^# ' "$scratch"/server "$scratch"/client* | tr '\n' ' ')"
}

refuse() {
  local out rc=0
  out=$(timeout 30 "$rpc" "$@" 2>&1) || rc=$?
  if ((rc == 2)) && grep -q "^error: " <<<"$out"; then
    echo "ok: ami_rpc $* refused: $out"
  else
    echo "FAIL: ami_rpc $*: exit $rc, expected 2 and an error line"; echo "$out"; failed+=("refuse $*")
  fi
}

session "1 thread, pause of 1.5 s" 30 -n 400 --idle-ms 1500
session "4 threads, window 8" - -T 4 -w 8 -n 3000
session "2 clients, 4 threads each" - -c 2 -T 4 -w 4 -n 1000
session "requests of several packets" - -s 100000 -w 2 -n 100 -T 2
AMI_OFI_PROVIDER='tcp;ofi_rxm' session "over libfabric tcp;ofi_rxm, pause of 1.5 s" 30 --backend ofi -n 400 --idle-ms 1500

refuse -n 0
refuse -T 65
refuse --backend nonesuch
refuse -r 2 -c 1 127.0.0.1
refuse -r 1
refuse 127.0.0.1 extra

if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
