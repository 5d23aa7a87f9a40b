#!/bin/sh
# compile_fail.sh EXPECTED SOURCE COMPILER [ARGS...]
#
# Passes when SOURCE compiles with -DAMI_KNOWN_NAME and fails without it,
# EXPECTED appearing in the compiler's diagnostics: proof that the failure
# is the one under test, not a missing header or a flag.
set -u
expected=$1
source=$2
shift 2
if ! "$@" -DAMI_KNOWN_NAME -fsyntax-only "$source"; then
  echo "compile_fail: $source does not compile even with a known name"
  exit 1
fi
if out=$("$@" -fsyntax-only "$source" 2>&1); then
  echo "compile_fail: $source compiled with a name the table lacks"
  exit 1
fi
case $out in
  *"$expected"*) echo "compile_fail: refused as expected ($expected)"; exit 0 ;;
esac
printf '%s\n' "$out"
echo "compile_fail: the diagnostics do not name $expected"
exit 1
