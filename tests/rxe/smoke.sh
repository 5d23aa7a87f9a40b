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
  [[ ${RXE_VM:-} == 1 ]] || { echo "SKIPPED: run inside tests/rxe/ami-vm"; exit 77; }
  local cmd missing=()
  for cmd in ibv_devinfo ib_write_bw ib_send_bw; do
    command -v "$cmd" >/dev/null || missing+=("$cmd")
  done
  ((${#missing[@]} == 0)) ||
    { echo "SKIPPED: missing ${missing[*]} (Debian packages ibverbs-utils perftest)"; exit 77; }
  device=${AMI_NET_DEVICES%%:*}
  gid_index=${RXE_GID_INDEX:?RXE_GID_INDEX not set}
  [[ -n $(rxe_server_ip) ]] || fail "rxenet0 has no IPv4 address"
}

check_port() {
  local info
  info=$(ibv_devinfo -d "$device") || fail "ibv_devinfo -d $device failed"
  grep -q 'state:.*PORT_ACTIVE' <<<"$info" || { echo "$info"; fail "$device port not active"; }
  echo "ok: $device port 1 is PORT_ACTIVE, $(grep -o 'active_mtu:.*' <<<"$info" | tr -s '\t ' ' ')"
}

. "$(dirname "$0")/perftest_pair.sh"

# smoke_pair NAME PORT TOOL ARGS...: server in the background, client to
# the dummy netdev's address; both must succeed.
smoke_pair() {
  local name=$1 port=$2 out=/tmp/smoke-$1
  shift 2
  if ! perftest_pair "$out" "$port" "$STEP_TIMEOUT" "$@"; then
    echo "--- server"; cat "$out.server"; echo "--- client"; cat "$out.client"
    fail "$name failed"
  fi
  echo "ok: $name: $(awk '/^ *65536 /{ print "65536 B x " $2 " iters, " $4 " MB/s avg" }' "$out.client")"
}

main() {
  check_env
  check_port
  smoke_pair ib_write_bw 18515 ib_write_bw -d "$device" -x "$gid_index" -s 65536 -n 200
  smoke_pair ib_send_bw-rdma_cm 18525 ib_send_bw -d "$device" -R -s 65536 -n 200
  echo "smoke: rxe0 works"
}

main "$@"
