#!/bin/bash
# The perftest-like tools on this host: every tool on shm and on self with
# --local, checked for a result row per size; perftest's default sizes and
# -a sweep; the JSON report and its plot (bench/plot_json.sh); and the
# refusals of bad command lines. (On verbs they run in tests/rxe/suite.sh.)
# usage: tools.sh BUILD_DIR [SOURCE_DIR]
set -uo pipefail
build=${1:?usage: tools.sh BUILD_DIR [SOURCE_DIR]}
source_dir=${2:-$(dirname "$0")/../..}
failed=()
scratch=$(mktemp -d)
json=$scratch/report.json
trap 'rm -rf "$scratch"' EXIT

# run NAME EXPECT_ROWS ARGS...: the tool must succeed and print a row for
# each size in EXPECT_ROWS.
run() {
  local name=$1 sizes=$2 out size
  shift 2
  if ! out=$(timeout 120 "$build/tools/$name" "$@" 2>&1); then
    echo "FAIL: $name $*: exit status"; echo "$out"; failed+=("$name $*"); return
  fi
  for size in $sizes; do
    grep -Eq "^ $size +[0-9]+ +[0-9.]+" <<<"$out" ||
      { echo "FAIL: $name $*: no row for $size B"; echo "$out"; failed+=("$name $*"); return; }
  done
  echo "ok: $name $*"
}

# refuse NAME ARGS...: a bad command line is exit status 2 with an error line.
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

for tool in ami_send_lat ami_write_lat ami_read_lat; do
  run "$tool" "2 4096 65536 8388608" --local -n 100 -a
  run "$tool" "8" --local -n 200 -s 8
  run "$tool" "3000" --backend self -n 200 -s 3000
done
for tool in ami_send_bw ami_write_bw ami_read_bw; do
  run "$tool" "65536" --local -n 300 -s 65536
  run "$tool" "2" --local -n 300 -s 2 -t 16 --report_gbits
  run "$tool" "1048576" --backend self -n 50 -s 1048576
done
# Without -s, perftest's sizes: 65536 bytes in bandwidth tests, 2 in latency tests.
for tool in ami_send_bw ami_write_bw ami_read_bw; do run "$tool" "65536" --local -n 300; done
for tool in ami_send_lat ami_write_lat ami_read_lat; do run "$tool" "2" --local -n 200; done
# -a: perftest's sweep, 2 B..8 MiB in powers of two, nothing else.
run ami_write_lat "2 8388608" --local -n 20 -a --out_json_file="$json"
if python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
assert [x["bytes"] for x in r["results"]] == [2 ** k for k in range(1, 24)], r["results"]
assert r["t_unit"] == "usec" and all(x["t_typical"] > 0 for x in r["results"])' "$json"; then
  echo "ok: -a sizes"
else
  echo "FAIL: -a sizes"; cat "$json"; failed+=("-a sizes")
fi

run ami_write_bw "4096" --local -n 100 -s 4096 --out_json_file="$json"
if python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
assert r["tool"] == "ami_write_bw" and r["backend"] == "shm"
assert r["results"][0]["bytes"] == 4096 and r["results"][0]["bw_average"] > 0' "$json"; then
  echo "ok: JSON report"
else
  echo "FAIL: JSON report"; cat "$json"; failed+=("JSON report")
fi

# One command plots a report (and several).
if command -v gnuplot >/dev/null; then
  run ami_read_bw "2 64" --local -n 100 -a --out_json_file="$scratch/get.json"
  plot=$scratch/put.png
  if out=$("$source_dir/bench/plot_json.sh" "$json" "$plot" 2>&1) && [[ $(head -c 8 "$plot" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] &&
     out=$("$source_dir/bench/plot_json.sh" "$json" "$scratch/get.json" "$scratch/both.png" 2>&1) &&
     [[ -s $scratch/both.png ]]; then
    echo "ok: bench/plot_json.sh draws the reports"
  else
    echo "FAIL: bench/plot_json.sh: $out"; failed+=("plot_json")
  fi
else
  echo "skipped: bench/plot_json.sh (no gnuplot: apt-get install gnuplot-nox)"
fi

# -e: both sides sleep on their contexts' event_fd() between messages
# (ami::wait_until), one packet and several, shm and self.
run ami_send_lat "8" --local -e -n 300 -s 8
run ami_send_lat "65536" --local -e -n 100 -s 65536
run ami_send_lat "8" --backend self -e -n 300 -s 8
run ami_send_bw "4096" --local -e -n 2000 -s 4096 -t 16
run ami_read_lat "4096" --local -e -n 200 -s 4096
run ami_read_bw "65536" --local -e -n 300 -s 65536
run ami_send_lat "8" --local -e --spin 5 -n 300 -s 8

refuse ami_write_lat -e
refuse ami_write_bw --events
refuse ami_send_lat --spin 5
refuse ami_send_lat -s 0
refuse ami_send_lat --backend tcp
refuse ami_write_bw -m 1000
refuse ami_write_bw -d rxe0 --backend shm
refuse ami_read_bw -i 1
refuse ami_send_bw -d rxe0 --post_list 0
refuse ami_write_bw -d rxe0 -l 257
refuse ami_send_bw --local some-host

if ((${#failed[@]})); then
  echo "${#failed[@]} failed: ${failed[*]}"
  exit 1
fi
echo "every tool run passed"
