#!/bin/bash
# Soft-RoCE smoke check, run inside the VM:  tests/rxe/ami-vm -- tests/rxe/smoke.sh
# Proves that rxe0 is usable before the transport's own tests run on it:
# port 1 is PORT_ACTIVE, and perftest client/server pairs on rxe0 complete
# (plain verbs RC RDMA WRITE, then RC SEND connected through rdma_cm).
# Exit status: 0 on success, 1 on failure, 77 when it cannot run here.
set -euo pipefail

readonly STEP_TIMEOUT=120

fail() { echo "FAIL: $*" >&2; exit 1; }

check_env() {
  [[ ${AMI_IN_VM:-} == 1 ]] || { echo "SKIPPED: run inside tests/rxe/ami-vm"; exit 77; }
  local cmd missing=()
  for cmd in ibv_devinfo ib_write_bw ib_send_bw; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
  done
  ((${#missing[@]} == 0)) ||
    { echo "SKIPPED: missing ${missing[*]} (Debian packages ibverbs-utils perftest)"; exit 77; }
  device=${AMI_NET_DEVICES%%:*}
  gid_index=${AMI_RXE_GID_INDEX:?AMI_RXE_GID_INDEX not set}
  server_ip=$(ip -4 -o addr show dev rxenet0 | awk '{ sub(/\/.*/, "", $4); print $4; exit }')
  [[ -n $server_ip ]] || fail "rxenet0 has no IPv4 address"
}

check_port() {
  local info
  info=$(ibv_devinfo -d "$device") || fail "ibv_devinfo -d $device failed"
  grep -q 'state:.*PORT_ACTIVE' <<<"$info" || { echo "$info"; fail "$device port not active"; }
  echo "ok: $device port 1 is PORT_ACTIVE, $(grep -o 'active_mtu:.*' <<<"$info" | tr -s '\t ' ' ')"
}

# Waits until the server listens on port $1: a TCP socket for perftest's
# out-of-band exchange, or an rdma_cm id in LISTEN state with -R.
wait_listen() {
  local port=$1 port_hex deadline=$((SECONDS + 30))
  port_hex=$(printf '%04X' "$port")
  while ((SECONDS < deadline)); do
    grep -q ":$port_hex [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
    rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN .*:$port\b" && return 0
    sleep 0.2
  done
  return 1
}

# perftest_pair NAME PORT TOOL ARGS...: server in the background, client to
# the dummy netdev's address; both must succeed.
perftest_pair() {
  local name=$1 port=$2 tool=$3 server_pid rc=0 server_rc=0 out=/tmp/smoke-$1
  shift 3
  timeout "$STEP_TIMEOUT" "$tool" -p "$port" "$@" >"$out.server" 2>&1 &
  server_pid=$!
  wait_listen "$port" || { kill "$server_pid" 2>/dev/null; cat "$out.server"; fail "$name: server did not listen"; }
  timeout "$STEP_TIMEOUT" "$tool" -p "$port" "$@" "$server_ip" >"$out.client" 2>&1 || rc=$?
  wait "$server_pid" || server_rc=$?
  if ((rc == 0)); then rc=$server_rc; fi
  if ((rc != 0)); then
    echo "--- server"; cat "$out.server"; echo "--- client"; cat "$out.client"
    fail "$name exited $rc"
  fi
  echo "ok: $name: $(awk '/^ *65536 /{ print "65536 B x " $2 " iters, " $4 " MB/s avg" }' "$out.client")"
}

main() {
  check_env
  check_port
  perftest_pair ib_write_bw 18515 ib_write_bw -d "$device" -x "$gid_index" -s 65536 -n 200
  perftest_pair ib_send_bw-rdma_cm 18516 ib_send_bw -d "$device" -R -s 65536 -n 200
  echo "smoke: rxe0 works"
}

main "$@"
