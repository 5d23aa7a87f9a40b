#!/bin/bash
# The verbs part of the test suite, run inside ONE boot of the VM:
#
#   tests/rxe/ami-vm -- tests/rxe/suite.sh BUILD_DIR
#
# (meson test --suite rxe does exactly that). In order: the smoke check
# (rxe0 active, perftest pairs complete), the verbs backend's own tests, the
# backend-agnostic tests on verbs. Every step runs even when
# an earlier one failed (except a failed smoke check: then rxe0 is unusable);
# the exit status is 0 only when every step passed, 77 when it cannot run here.
set -uo pipefail

readonly STEP_TIMEOUT=600
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: suite.sh BUILD_DIR}
build=$(cd "$build" && pwd)

[[ ${AMI_IN_VM:-} == 1 ]] || { echo "SKIPPED: run inside tests/rxe/ami-vm"; exit 77; }

failed=()
step() {  # step NAME COMMAND...
  local name=$1 start=$SECONDS rc=0
  shift
  echo "=== $name"
  timeout "$STEP_TIMEOUT" "$@" || rc=$?
  if ((rc == 0)); then
    echo "=== ok: $name ($((SECONDS - start)) s)"
  else
    echo "=== FAIL: $name: exit $rc ($((SECONDS - start)) s)"
    failed+=("$name")
  fi
  return "$rc"
}

step smoke "$here/smoke.sh" || { echo "rxe0 is not usable: the verbs tests cannot run"; exit 1; }
step test_verbs "$build/tests/unit/test_verbs"
step backends_verbs "$build/tests/unit/test_backends_verbs"
if ((${#failed[@]})); then
  echo "rxe suite: ${#failed[@]} step(s) failed: ${failed[*]}"
  exit 1
fi
echo "rxe suite: every step passed"
