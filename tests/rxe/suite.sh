#!/bin/bash
# The verbs part of the test suite, run inside ONE boot of the VM:
#
#   tests/rxe/ami-vm -- tests/rxe/suite.sh BUILD_DIR [sanitized]
#
# (meson test --suite rxe does exactly that). In order: the smoke check
# (rxe0 active, perftest pairs complete), the verbs backend's own tests, the
# backend-agnostic tests on verbs (the collectives among them), then every
# perftest-like tool on verbs with perftest's device options, connected by
# rdma_cm and by the handshake on first use, each checked for its
# result row. Every step runs even when an earlier one failed (except a
# failed smoke check: then rxe0 is unusable); the exit status is 0 only when
# every step passed, 77 when it cannot run here. "sanitized" (a build under
# AddressSanitizer, whose programs run two to four times slower) leaves out
# the libfabric backend on verbs;ofi_rxm (its steps, and its pairs' cases in
# the conformance and atomics suites): its code is the same on every
# provider, and the sanitized suite runs it on tcp and shm on the host. It
# leaves out the tools' runs, the collectives and the mpirun jobs too: they
# run sanitized on the host, and on verbs they drive the code the verbs
# tests above have run.
set -uo pipefail

readonly STEP_TIMEOUT=600
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: suite.sh BUILD_DIR [sanitized]}
build=$(cd "$build" && pwd)
sanitized=${2:-}
[[ -z $sanitized || $sanitized == sanitized ]] || { echo "suite.sh: unknown mode '$sanitized'"; exit 2; }

[[ ${RXE_VM:-} == 1 ]] || { echo "SKIPPED: run inside tests/rxe/ami-vm"; exit 77; }

failed=()
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# The soft-RoCE device's own counters (retries, RNR NAKs, duplicates,
# sequence errors), one "name value" line each.
rxe_counters() {
  local f
  for f in /sys/class/infiniband/"${AMI_NET_DEVICES%%:*}"/ports/1/hw_counters/*; do
    [[ -r $f ]] && echo "${f##*/} $(<"$f")"
  done
}

step() {  # step NAME COMMAND...
  local name=$1 start=$SECONDS rc=0
  shift
  echo "=== $name"
  rxe_counters > "$logs/$name.counters"
  timeout "$STEP_TIMEOUT" "$@" 2>&1 | tee "$logs/$name.log"
  rc=${PIPESTATUS[0]}
  if ((rc == 0)); then
    echo "=== ok: $name ($((SECONDS - start)) s)"
  else
    # What the device saw during the step, at the end of its log: a stall
    # behind retransmissions or RNR NAKs shows here, not in ami's counters.
    rxe_counters > "$logs/$name.counters-after"
    awk 'NR == FNR { was[$1] = $2; next } $2 != was[$1] { printf " %s +%d", $1, $2 - was[$1] }
         END { print "" }' "$logs/$name.counters" "$logs/$name.counters-after" |
      sed 's/^/rxe counters that moved during the step:/' | tee -a "$logs/$name.log"
    echo "=== FAIL: $name: exit $rc ($((SECONDS - start)) s)"
    failed+=("$name")
  fi
  return "$rc"
}

# tool_step NAME SIZE [VAR=VALUE...] -- TOOL_ARGS...: runs tools/NAME
# --local on rxe0 with the given environment and checks that its table has
# a row for SIZE.
tool_step() {
  local name=$1 size=$2 env=() out rc=0
  shift 2
  while [[ $1 != -- ]]; do env+=("$1"); shift; done
  shift
  echo "=== ${name} -s $size $* ${env[*]}"
  out=$(timeout "$STEP_TIMEOUT" env "${env[@]}" "$build/tools/$name" --local -d "${AMI_NET_DEVICES%%:*}" \
        -s "$size" "$@" 2>&1) || rc=$?
  echo "$out"
  if ((rc == 0)) && ! grep -Eq "^ $size +[0-9]+ +[0-9.]+" <<<"$out"; then
    echo "$name: no result row for $size B"
    rc=1
  fi
  if ((rc == 0)); then
    echo "=== ok: $name"
  else
    echo "=== FAIL: $name: exit $rc"
    failed+=("$name $*")
  fi
}

step smoke "$here/smoke.sh" || { echo "rxe0 is not usable: the verbs tests cannot run"; exit 1; }
step test_verbs "$build/tests/backends/test_verbs"
# The conformance and atomics programs hold every pair's cases: the RDMA
# pairs' run here, by name (the sanitized suite leaves libfabric's out).
rdma_pairs=(--test-case='*<VerbsPair>,*<OfiVerbsPair>')
[[ -n $sanitized ]] && rdma_pairs=(--test-case='*<VerbsPair>')
step backends_verbs "$build/tests/backends/test_backends_verbs" "${rdma_pairs[@]}"
# (and verbs with the NIC's atomic domain: AMI_ATOMIC_MODE=nic)
atomics_pairs=(--test-case="${rdma_pairs[0]#--test-case=},*<VerbsNicPair>")
step atomics_verbs "$build/tests/backends/test_atomics_verbs" "${atomics_pairs[@]}"
step wireup_verbs "$build/tests/backends/test_wireup_verbs"
step peer_failure_verbs env AMI_TEST_BACKEND=verbs "$build/tests/protocol/test_peer_failure"
if [[ -n $sanitized ]]; then
  # (The collectives and the launcher run sanitized on the host, over shm
  # and libfabric and under mpirun and srun; on verbs they drive the device
  # code that the steps above ran sanitized, wire-up on demand included.)
  echo "=== (sanitized build: the collectives and mpirun on verbs, libfabric on verbs;ofi_rxm and the"
  echo "===  tools' runs on rxe0 are the unsanitized suite's)"
else
  step collectives_verbs env AMI_TEST_BACKEND=verbs "$build/tests/collectives/test_collectives"
  # A job started by mpirun (PMIx) over verbs alone: addresses fetched on
  # first use, queue pairs made with tasks learnt on demand, by the
  # handshake and by rdma_cm.
  step mpirun_verbs env AMI_BACKENDS=self,verbs "$here/../mpi/mpirun.sh" 3 "$build/tests/mpi/test_mpirun"
  step mpirun_verbs_cm env AMI_BACKENDS=self,verbs AMI_VERBS_CM=on "$here/../mpi/mpirun.sh" 3 \
    "$build/tests/mpi/test_mpirun"
  # The libfabric backend on verbs;ofi_rxm over rxe0 (the conformance
  # suite's ofi pairs ran in backends_verbs).
  step peer_failure_ofi_verbs env 'AMI_TEST_BACKEND=ofi:verbs;ofi_rxm' "$build/tests/protocol/test_peer_failure"
  step collectives_ofi_verbs env 'AMI_TEST_BACKEND=ofi:verbs;ofi_rxm' "$build/tests/collectives/test_collectives"

  gid=${RXE_GID_INDEX:?RXE_GID_INDEX not set}
  json=$(mktemp)
  tool_step ami_send_lat 2 -- -n 300 -R
  tool_step ami_send_lat 8192 AMI_VERBS_CM=off -- -n 100 -x "$gid" -I 0
  tool_step ami_write_lat 2 AMI_VERBS_CM=off -- -n 300
  tool_step ami_write_lat 65536 -- -n 100 -R -m 1024
  tool_step ami_read_lat 4096 -- -n 200 -R
  tool_step ami_atomic_lat 8 -- -n 200 -A CMP_AND_SWAP
  tool_step ami_atomic_bw 8 -- -n 2000 -A FETCH_AND_ADD -o 16
  tool_step ami_send_bw 65536 -- -n 200 -t 32 -Q 4 --out_json_file="$json"
  if python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["results"][0]["bytes"] == 65536 and r["setup"]["Device"]' "$json"; then
    echo "=== ok: JSON report"
  else
    echo "=== FAIL: ami_send_bw --out_json_file wrote no valid report"
    failed+=("JSON report")
  fi
  tool_step ami_write_bw 1048576 AMI_VERBS_CM=off -- -n 50 --report_gbits
  tool_step ami_write_bw 2 AMI_VERBS_CM=off -- -n 2000 -l 1
  tool_step ami_read_bw 65536 -- -n 200 -R -t 16
  rm -f "$json"
fi

if ((${#failed[@]})); then
  # The tail of each failed step again, so that it shows in a log cut short.
  for name in "${failed[@]}"; do
    [[ -f "$logs/$name.log" ]] || continue
    echo "=== last lines of the failed step $name"
    tail -n 40 "$logs/$name.log"
  done
  echo "rxe suite: ${#failed[@]} step(s) failed: ${failed[*]}"
  exit 1
fi
echo "rxe suite: every step passed"
