# Sourced (inside the VM) by smoke.sh and bench/rxe_vs_perftest.sh: runs a
# perftest server and client pair on rxe0.
#
# perftest refuses to run when its clock calibration is noisy
# ("Correlation coefficient r^2 < 0.9", common in a TCG VM): a pair whose
# client refused measured nothing and is run again, up to five times, on a
# fresh port. A server that refused only its own report (the client ran
# the test and printed its figures, which are the ones read) is a pair
# that worked. A side that fails leaves the other waiting for it, so it is
# stopped.

# The IPv4 address of the netdev under rxe0.
rxe_server_ip() {
  ip -4 -o addr show dev rxenet0 | awk '{ sub(/\/.*/, "", $4); print $4; exit }'
}

# wait_listen PORT [PID]: until a server listens there, by TCP (perftest's
# address exchange) or as an rdma_cm id (-R); false after 30 s or once the
# server's process PID has ended.
wait_listen() {
  local port=$1 pid=${2:-} port_hex deadline=$((SECONDS + 30))
  port_hex=$(printf '%04X' "$port")
  while ((SECONDS < deadline)) && { [[ -z $pid ]] || kill -0 "$pid" 2>/dev/null; }; do
    grep -q ":$port_hex [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
    rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN .*:$port\b" && return 0
    sleep 0.1
  done
  return 1
}

# perftest_once OUT PORT LIMIT TOOL ARGS...: one attempt; OUT.server and
# OUT.client get the outputs; 0 when both sides succeeded, 2 when only the
# server failed, over its clock calibration.
perftest_once() {
  local out=$1 port=$2 limit=$3 tool=$4 spid cpid ip
  shift 4
  ip=$(rxe_server_ip)
  : >"$out.client"
  timeout "$limit" "$tool" -p "$port" "$@" >"$out.server" 2>&1 &
  spid=$!
  if ! wait_listen "$port" "$spid"; then
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    echo "perftest_pair: $tool server did not listen on $port" >>"$out.server"
    return 1
  fi
  timeout "$limit" "$tool" -p "$port" "$@" "$ip" >"$out.client" 2>&1 &
  cpid=$!
  # Whichever side ends first: on failure the other gets 3 s, then stops.
  local first first_rc=0 other other_rc=0
  wait -n -p first "$spid" "$cpid" || first_rc=$?
  other=$spid
  [[ $first == "$spid" ]] && other=$cpid
  if ((first_rc != 0)); then
    sleep 3
    kill "$other" 2>/dev/null
  fi
  wait "$other" || other_rc=$?
  local server_rc=$first_rc client_rc=$other_rc
  [[ $first == "$cpid" ]] && server_rc=$other_rc client_rc=$first_rc
  ((server_rc == 0 && client_rc == 0)) && return 0
  if ((client_rc == 0)) && grep -qs "Correlation coefficient" "$out.server"; then return 2; fi
  return 1
}

# perftest_pair OUT PORT LIMIT TOOL ARGS...: perftest_once, again on a
# calibration refusal that cost the client's figures (on PORT+1, ...).
perftest_pair() {
  local out=$1 port=$2 attempt rc
  shift 2
  for attempt in 0 1 2 3 4; do
    rc=0
    perftest_once "$out" $((port + attempt)) "$@" || rc=$?
    ((rc == 0)) && return 0
    if ((rc == 2)); then
      echo "perftest_pair: $2 server refused its own report over its clock calibration; the client's stands" >&2
      return 0
    fi
    grep -qs "Correlation coefficient" "$out.server" "$out.client" || return 1
    echo "perftest_pair: $2 refused over its clock calibration; again" >&2
  done
  return 1
}
