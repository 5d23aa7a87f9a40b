#!/bin/bash
# Runs a test program as a job of NP processes under Open MPI's mpirun (the
# program checks that its Client bootstrapped through PMIx). Prints SKIPPED
# and exits 77 where there is no such mpirun.
# usage: mpirun.sh NP PROGRAM [ARGS...]
set -uo pipefail
np=${1:?usage: mpirun.sh NP PROGRAM [ARGS...]}
program=${2:?usage: mpirun.sh NP PROGRAM [ARGS...]}
shift 2

if ! command -v mpirun >/dev/null; then
  echo "SKIPPED: no mpirun on PATH (Debian: apt-get install openmpi-bin)"
  exit 77
fi
if ! version=$(mpirun --version 2>&1) || ! grep -q "Open MPI" <<<"$version"; then
  echo "SKIPPED: mpirun is not Open MPI's, the options below are its: $(head -n1 <<<"$version")"
  exit 77
fi

# --oversubscribe: more processes than cores is fine for a test.
# --tag-output: every line says which rank printed it.
options=(--oversubscribe --tag-output -np "$np")
# Open MPI refuses root unless told otherwise (containers, CI).
if (($(id -u) == 0)); then options+=(--allow-run-as-root); fi

echo "mpirun ${options[*]} $program --ranks=$np $*"
timeout -k 10 240 mpirun "${options[@]}" "$program" --ranks="$np" "$@"
rc=$?
if ((rc == 124)); then echo "FAIL: the job of $np did not finish within 240 s"; fi
exit $rc
