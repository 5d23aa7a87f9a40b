# bench/rounds.sh — sourced by the benchmarks that run interleaved rounds
# (wakeup.sh, atomics.sh): series of figures, their medians and ratios,
# and ucx_perftest for the side-by-side runs.

median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else print v[int((NR + 1) / 2)]}'; }
# ratio A B -> A / B to three decimals, n/a when either is missing or 0
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.3f", a / b; else print "n/a" }'; }

# add SERIES FIGURE (an empty figure adds nothing); med SERIES -> its
# median; last SERIES -> the figure the current round added (.dat rows)
declare -A samples
add() { [[ -n $2 ]] && samples[$1]+="$2"$'\n'; return 0; }
med() { printf '%s' "${samples[$1]:-}" | median; }
last() { printf '%s' "${samples[$1]:-}" | tail -1; }

# ucx_perftest comes from Debian's ucx-utils, installed when missing.
ensure_ucx() {
  command -v ucx_perftest >/dev/null && return 0
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  echo "# installing ucx-utils (ucx_perftest)" >&2
  $sudo apt-get install -y -qq --no-install-recommends ucx-utils >/dev/null 2>&1 ||
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends ucx-utils >/dev/null; }
}
