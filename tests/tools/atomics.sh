#!/bin/bash
# ami_atomic_lat and ami_atomic_bw on this host: shm (the server's word is
# in memory it allocated, which the client maps: CPU atomics on the
# mapping) and self, both atomic types, a row for the 8-byte word each;
# the JSON report's test name; and the refusals of options they do not
# take. (On verbs they run in tests/rxe/suite.sh.)
# usage: atomics.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: atomics.sh BUILD_DIR}
failed=()
scratch=$(mktemp -d)
json=$scratch/report.json
trap 'rm -rf "$scratch"' EXIT

run() {
  local name=$1 out
  shift
  if ! out=$(timeout 120 "$build/tools/$name" "$@" 2>&1); then
    echo "FAIL: $name $*: exit status"; echo "$out"; failed+=("$name $*"); return
  fi
  grep -Eq "^ 8 +[0-9]+ +[0-9.]+" <<<"$out" || { echo "FAIL: $name $*: no row for 8 B"; echo "$out"; failed+=("$name $*"); return; }
  grep -q "Atomic Type" <<<"$out" || { echo "FAIL: $name $*: no atomic type line"; echo "$out"; failed+=("$name $*"); return; }
  echo "ok: $name $*"
}

refuse() {
  local name=$1 out rc=0
  shift
  out=$(timeout 30 "$build/tools/$name" "$@" 2>&1) || rc=$?
  if ((rc == 2)) && grep -q "^error: " <<<"$out"; then
    echo "ok: $name $* refused: $out"
  else
    echo "FAIL: $name $*: exit $rc, expected 2 and an error line"; echo "$out"; failed+=("$name $*")
  fi
}

for type in FETCH_AND_ADD CMP_AND_SWAP; do
  run ami_atomic_lat --local -n 300 -A "$type"
  run ami_atomic_lat --backend self -n 300 -A "$type"
  run ami_atomic_bw --local -n 2000 -A "$type" -o 16
  run ami_atomic_bw --backend self -n 2000 -A "$type"
done
run ami_atomic_lat --local -n 100 -s 8 --out_json_file="$json"
if python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
assert r["test"] == "Atomic FETCH_AND_ADD Latency Test" and [x["bytes"] for x in r["results"]] == [8], r' "$json"; then
  echo "ok: JSON report"
else
  echo "FAIL: JSON report"; failed+=("json")
fi
refuse ami_atomic_lat -A FETCH_AND_XOR
refuse ami_atomic_bw -s 64
refuse ami_atomic_lat -a
refuse ami_read_lat -A CMP_AND_SWAP
refuse ami_write_bw -o 4

if ((${#failed[@]})); then
  echo "${#failed[@]} failed:"; printf '  %s\n' "${failed[@]}"; exit 1
fi
