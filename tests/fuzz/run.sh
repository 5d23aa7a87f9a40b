#!/bin/bash
# Runs every libFuzzer target of BUILD_DIR (configured with -Dfuzz=true) for
# SECONDS each, starting from the seed corpus in tests/fuzz/corpus; new
# inputs go to a scratch copy, so the committed corpus stays small. Exit 0
# when no target found a crash, a sanitizer report or a broken invariant.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR [SECONDS]}" && pwd)
seconds=${2:-60}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for name in packets address_blob; do
  target="$build/tests/fuzz/fuzz_$name"
  [[ -x $target ]] || { echo "run.sh: $target is missing (configure with -Dfuzz=true)"; exit 1; }
  cp -r "$here/corpus/$name" "$work/$name"
  echo "=== fuzz_$name for $seconds s"
  if (cd "$work" && "$target" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
      "$work/$name" 2>&1 | tail -15); then
    echo "=== ok: fuzz_$name"
  else
    echo "=== FAIL: fuzz_$name (crash input saved in the output above)"
    failed+=("$name")
  fi
done
((${#failed[@]} == 0))
