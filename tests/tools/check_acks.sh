#!/bin/bash
# The send tools with --remote_done on this host (shm, --local): a result
# row, then an "# acks:" line from each side that sent acks whose ratio of
# acks to messages answered is at most 1; the acks in the JSON report; and
# the refusal of --remote_done by the tests that send no messages.
# usage: check_acks.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: check_acks.sh BUILD_DIR}
failed=()
json=$(mktemp)
trap 'rm -f "$json"' EXIT

# acks NAME LINES ARGS...: the tool must succeed, print a row for 8 B and
# LINES "# acks:" lines, each answering at least one message with at most
# one ack per message.
acks() {
  local name=$1 lines=$2 out found
  shift 2
  if ! out=$(timeout 120 "$build/tools/$name" "$@" 2>&1); then
    echo "FAIL: $name $*: exit status"; echo "$out"; failed+=("$name $*"); return
  fi
  if ! grep -Eq "^ 8 +[0-9]+ +[0-9.]+" <<<"$out"; then
    echo "FAIL: $name $*: no row for 8 B"; echo "$out"; failed+=("$name $*"); return
  fi
  found=$(awk '/^# acks: / {
      n++
      if (!match($0, /^# acks: [0-9]+ messages answered by [0-9]+ acks \([0-9.]+ acks per message\), idle threshold [0-9]+, window [0-9]+$/)) bad++
      else if ($3 + 0 < 1 || $9 + 0 > 1) bad++
    } END { print n + 0, bad + 0 }' <<<"$out")
  if [[ $found != "$lines 0" ]]; then
    echo "FAIL: $name $*: expected $lines acks line(s), each with at most one ack per message"
    echo "$out"; failed+=("$name $*"); return
  fi
  echo "ok: $name $*: $(grep '^# acks: ' <<<"$out" | sed 's/^# acks: //' | paste -sd ';')"
}

# refuse NAME ARGS...: exit status 2 and an error line.
refuse() {
  local name=$1 out rc=0
  shift
  out=$(timeout 30 "$build/tools/$name" "$@" 2>&1) || rc=$?
  if ((rc == 2)) && grep -q "^error: .*--remote_done" <<<"$out"; then
    echo "ok: $name $* refused: $out"
  else
    echo "FAIL: $name $*: exit $rc, expected 2 and an error line"; echo "$out"; failed+=("$name $*")
  fi
}

# The bandwidth test: the server answers (one line); latency: both sides do.
acks ami_send_bw 1 --local -s 8 -n 2000 --remote_done
acks ami_send_lat 2 --local -s 8 -n 500 --remote_done
acks ami_send_lat 2 --backend self -s 8 -n 200 --remote_done

acks ami_send_bw 1 --local -s 8 -n 1000 --remote_done --out_json_file="$json"
if python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
a = r["acks"]["server"]
assert r["tool"] == "ami_send_bw" and set(r["acks"]) == {"server"}
assert a["messages_acked"] >= 1000 and 0 < a["acks_per_message"] <= 1
assert a["acks_sent"] == round(a["acks_per_message"] * a["messages_acked"])
assert isinstance(a["idle_threshold"], int) and a["window"] >= 1' "$json"; then
  echo "ok: JSON report with acks"
else
  echo "FAIL: JSON report with acks"; cat "$json"; failed+=("JSON report with acks")
fi

refuse ami_write_bw --remote_done
refuse ami_read_lat --remote_done --local

if ((${#failed[@]})); then
  echo "${#failed[@]} failed: ${failed[*]}"
  exit 1
fi
echo "every --remote_done run passed"
