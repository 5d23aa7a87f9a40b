#!/bin/sh
# layers_enforced.sh ALL_DIRS CASE... -- COMPILER [ARGS...]
#
# The layering is enforced by the include paths: each CASE is
# "layer|dir:dir...|legal,...|upward,..." and gives one layer's include path
# (the one its library is built with), headers it may include and headers
# of layers above it (or of other layers' internals) that it must not see.
# A file including a legal header must compile with that path, a file
# including an upward one must be refused with the header reported missing.
# ALL_DIRS (dir:dir...) is where every upward header must exist, so that a
# misspelt name cannot pass. Like compile_fail.sh: the compiler itself is
# the check, with a control that proves the flags are right.
set -u
all_dirs=$1
shift
cases=
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  cases="$cases
$1"
  shift
done
shift  # --
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
probe=$tmp/probe.cpp
failures=0
checked=0

exists() {
  old_ifs=$IFS; IFS=:
  for d in $all_dirs; do
    if [ -f "$d/$1" ]; then IFS=$old_ifs; return 0; fi
  done
  IFS=$old_ifs
  return 1
}

compile() {  # compile DIRS HEADER: the compiler's output and status
  printf '#include "%s"\n' "$2" >"$probe"
  incs=$(printf '%s' "$1" | tr ':' '\n' | sed 's/^/-I/' | tr '\n' ' ')
  # shellcheck disable=SC2086  # one word per flag (no directory has a space)
  $compiler $incs -fsyntax-only "$probe" 2>&1
}

compiler="$*"
old_ifs=$IFS
IFS='
'
for c in $cases; do
  [ -n "$c" ] || continue
  IFS='|'
  set -- $c
  IFS=$old_ifs
  layer=$1 dirs=$2 legal=$3 upward=$4
  for h in $(printf '%s' "$legal" | tr ',' ' '); do
    checked=$((checked + 1))
    if ! out=$(compile "$dirs" "$h"); then
      printf '%s\n' "$out"
      echo "layers: $layer cannot include \"$h\", which it may"
      failures=$((failures + 1))
    fi
  done
  for h in $(printf '%s' "$upward" | tr ',' ' '); do
    checked=$((checked + 1))
    if ! exists "$h"; then
      echo "layers: \"$h\" (not to be seen by $layer) is no header of ami"
      failures=$((failures + 1))
      continue
    fi
    if out=$(compile "$dirs" "$h"); then
      echo "layers: $layer can include \"$h\", a header above it or another layer's internal one"
      failures=$((failures + 1))
      continue
    fi
    case $out in
      # The probe's own include, not one inside the header, is missing.
      *"probe.cpp:1:"*"error: $h: No such file"* | *"probe.cpp:1:"*"error: '$h' file not found"*) ;;
      *)
        printf '%s\n' "$out"
        echo "layers: $layer refused \"$h\" for another reason than not finding it"
        failures=$((failures + 1)) ;;
    esac
  done
  IFS='
'
done
IFS=$old_ifs
echo "layers: $checked includes checked, $failures wrong"
[ "$failures" -eq 0 ]
