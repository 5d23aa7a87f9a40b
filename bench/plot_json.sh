#!/usr/bin/env bash
# bench/plot_json.sh — a PNG from the JSON reports of the tools
# (--out_json / --out_json_file): the figure against message size, drawn
# by bench/plot.sh.
#
# usage: bench/plot_json.sh REPORT.json [REPORT.json...] OUT.png
#
#   One report: every statistic of its table is a line (bandwidth tests:
#   average and peak; latency tests: typical, average, 99% and 99.9%).
#   Several: one line per report, named by tool and backend (and the file,
#   when two share those): the average bandwidth or the typical latency.
#   Reports of one kind only (all bandwidth or all latency, in one unit).
#
#   build/tools/ami_write_bw -a --local --out_json_file=put.json
#   build/tools/ami_write_bw -a --backend self --out_json_file=put-self.json
#   bench/plot_json.sh put.json put-self.json put.png
#
# Reads JSON with python3's json module; needs gnuplot (gnuplot-nox).
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")

(($# >= 2)) || { sed -n '5,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
out=${!#}
reports=("${@:1:$#-1}")
[[ $out == *.png ]] || { echo "plot_json.sh: the last argument must be the .png to write, not $out" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The table for plot.sh, and in labels the title and the y label.
python3 - "$work/table" "$work/labels" "${reports[@]}" <<'PY'
import json
import os
import sys

table_path, labels_path, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
reports = []
for path in paths:
    try:
        with open(path) as f:
            r = json.load(f)
        r["results"], r["tool"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plot_json.sh: {path} is not a tool's JSON report: {e}")
    reports.append((path, r))

latency = {"t_unit" in r for _, r in reports}
if len(latency) != 1:
    sys.exit("plot_json.sh: bandwidth and latency reports cannot share one plot")
latency = latency.pop()
unit_key = "t_unit" if latency else "bw_unit"
units = {r.get(unit_key) for _, r in reports}
if len(units) != 1:
    sys.exit(f"plot_json.sh: the reports are in different units: {sorted(map(str, units))}")
unit = units.pop()

if latency:
    stats = [("t_typical", "typical"), ("t_avg", "average"), ("t_99", "99%"), ("t_99.9", "99.9%")]
    ylabel = f"latency [{unit}]"
else:
    stats = [("bw_average", "average"), ("bw_peak", "peak")]
    ylabel = f"bandwidth [{unit}]"

def name(text):  # a header field: no blanks (plot.sh shows '_' as a space)
    return "_".join(str(text).split()) or "-"

columns = []  # (header, {bytes: value})
if len(reports) == 1:
    path, r = reports[0]
    for key, label in stats:
        columns.append((name(label), {row["bytes"]: row.get(key) for row in r["results"]}))
    title = f'{r["tool"]} ({r.get("backend", "?")}): {r.get("test", "")}'
else:
    key = stats[0][0]
    labels = [f'{r["tool"]} {r.get("backend", "")}'.strip() for _, r in reports]
    for (path, r), label in zip(reports, labels):
        if labels.count(label) > 1:
            label += f" {os.path.basename(path)}"
        columns.append((name(label), {row["bytes"]: row.get(key) for row in r["results"]}))
    title = f'{stats[0][1]} {"latency" if latency else "bandwidth"}'

sizes = sorted({b for _, values in columns for b in values})
with open(table_path, "w") as t:
    t.write("bytes " + " ".join(h for h, _ in columns) + "\n")
    for b in sizes:
        cells = []
        for _, values in columns:
            v = values.get(b)
            cells.append("nan" if v is None else repr(float(v)))
        t.write(f"{b} " + " ".join(cells) + "\n")
with open(labels_path, "w") as f:
    f.write(title + "\n" + ylabel + "\n")
PY

{ read -r title; read -r ylabel; } <"$work/labels"
"$here/plot.sh" -t "$title" -y "$ylabel" "$work/table" "$out"
