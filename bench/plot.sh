#!/usr/bin/env bash
# bench/plot.sh — one PNG from one table: a figure against message size, one
# line per column, both axes logarithmic. Every benchmark here draws its
# plots with it; a new one adds one call.
#
# usage: bench/plot.sh -y YLABEL [-t TITLE] [-x XLABEL] [--linear-x|--count-x] [--pairs] TABLE OUT.png
#
#   TABLE     a text file of whitespace-separated columns. Lines starting
#             with '#' and blank lines are skipped; the first other line is
#             the header naming the columns. The first column is x (message
#             size in bytes unless -x says otherwise); every other column is
#             one line of the plot, its header its name in the legend ('_'
#             shown as a space: "ami_write_bw" reads "ami write bw"). A field
#             that is not a positive number ("nan", "n/a", "-") is a gap.
#   OUT.png   the image written (900x600, pngcairo).
#   -y        the y axis label, with its unit: "bandwidth [MiB/s]", "latency [usec]"
#   -t        the title (default: the table's file name)
#   -x        the x axis label (default "message size"; on the log2 axis
#             the tics carry the unit: 2 B, 64 B, 4 KiB, 1 MiB)
#   --linear-x  x on a linear axis with plain numbers (a job size, say)
#   --count-x   x on the log2 axis with plain numbers (64, 1024, 16384 ranks)
#   --pairs   the columns go in pairs (ami, then the peer it is measured
#             against): each pair one colour, the second line dashed
#
# Example, from a benchmark (the table it printed, reshaped per size):
#   printf '%s\n' "bytes ami perftest" "2 0.48 0.44" "4096 95 97" >t.dat
#   bench/plot.sh -t "PUT bandwidth" -y "bandwidth [MiB/s]" t.dat t.png
#
# Needs gnuplot (Debian: gnuplot-nox). Exit status 0 when the PNG was
# written, 1 when it could not be (gnuplot missing, no data), 2 on a usage
# error; a benchmark calls it as `bench/plot.sh ... || true` so a missing
# plot never hides the table.
set -euo pipefail

usage() { sed -n '4,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

title="" xlabel="message size" ylabel="" linear_x=0 count_x=0 pairs=0
while (($#)); do
  case $1 in
    -t) title=${2:?-t needs a title}; shift 2 ;;
    -x) xlabel=${2:?-x needs a label}; shift 2 ;;
    -y) ylabel=${2:?-y needs a label}; shift 2 ;;
    --linear-x) linear_x=1; shift ;;
    --count-x) count_x=1; shift ;;
    --pairs) pairs=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "plot.sh: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
(($# == 2)) || usage
table=$1 out=$2
[[ -n $ylabel ]] || { echo "plot.sh: -y LABEL (with its unit) is required" >&2; exit 2; }
[[ -r $table ]] || { echo "plot.sh: cannot read $table" >&2; exit 1; }
[[ $out == *.png ]] || { echo "plot.sh: the output must be a .png file, not $out" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "plot.sh: no gnuplot (apt-get install gnuplot-nox): $out not drawn" >&2; exit 1; }
[[ -n $title ]] || title=$(basename "$table")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The data as gnuplot reads it: header dropped, every field that is not a
# positive number (a log axis has no place for zero) made NaN, which gnuplot
# leaves out and where it breaks the line; rows in order of x.
awk -v data="$work/data" -v names="$work/names" '
  /^[ \t]*(#|$)/ { next }
  !header { header = 1; for (i = 1; i <= NF; i++) print $i > names; n = NF; next }
  {
    line = ""
    for (i = 1; i <= n; i++) {
      v = (i <= NF) ? $i : "NaN"
      if (v !~ /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/ || v + 0 <= 0) v = "NaN"
      line = line (i > 1 ? " " : "") v
    }
    print line > data
  }' "$table"
[[ -s $work/names ]] || { echo "plot.sh: $table has no header row" >&2; exit 1; }
sort -g -k1,1 "$work/data" 2>/dev/null >"$work/sorted" || true
mapfile -t names <"$work/names"
((${#names[@]} >= 2)) || { echo "plot.sh: $table has no column to plot" >&2; exit 1; }
points=$(awk '$1 != "NaN" { for (i = 2; i <= NF; i++) if ($i != "NaN") { n++; break } } END { print n + 0 }' \
         "$work/sorted")
((points > 0)) || { echo "plot.sh: $table has no numbers to plot: $out not drawn" >&2; exit 1; }

# gnuplot string: double quotes, with \ and " escaped.
gq() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }

# x tics on the log2 axis: at most about a dozen powers of two, each with its
# unit ("16 B", "1 KiB", "1 MiB": exponents that are multiples of the step,
# so that KiB and MiB fall on a tic whenever the step allows), and a minor
# tic at every other power of two.
xtics=""
if ((linear_x == 0)); then
  xtics=$(awk -v count="$count_x" '$1 != "NaN" { v = log($1) / log(2); if (!seen++ || v < lo) lo = v; if (!hi || v > hi) hi = v }
    END {
      lo = int(lo); hi = int(hi + 0.999); f = 1
      while ((hi - lo) / f > 12) f *= 2
      for (e = lo; e <= hi; e++) {
        n = 2 ^ e
        if (e % f != 0) { out = out (out == "" ? "" : ", ") sprintf("\"\" %.0f 1", n); continue }
        if (count) t = sprintf("%.0f", n)
        else if (n >= 1073741824) t = sprintf("%g GiB", n / 1073741824)
        else if (n >= 1048576) t = sprintf("%g MiB", n / 1048576)
        else if (n >= 1024) t = sprintf("%g KiB", n / 1024)
        else t = sprintf("%g B", n)
        out = out (out == "" ? "" : ", ") sprintf("\"%s\" %.0f", t, n)
      }
      print "(" out ")"
    }' "$work/sorted")
fi

# y tics: gnuplot's are the decades; over three decades or fewer, 1, 2 and
# 5 of each decade too, so that a plot spanning one decade reads.
ytics=$(awk '{ for (i = 2; i <= NF; i++) if ($i != "NaN") { v = $i + 0; if (!n++ || v < lo) lo = v; if (v > hi) hi = v } }
  END {
    if (!n) exit
    e0 = int(log(lo) / log(10)); if (10 ^ e0 > lo) e0--
    e1 = int(log(hi) / log(10)); if (10 ^ e1 < hi) e1++
    if (e1 - e0 > 3) exit
    for (e = e0; e <= e1; e++) for (k = 1; k <= 5; k += (k == 1 ? 1 : 3)) {
      t = k * 10 ^ e
      if (t >= lo / 5 && t <= hi * 5) out = out (out == "" ? "" : ", ") sprintf("\"%g\" %g", t, t)
    }
    if (out != "") print "(" out ")"
  }' "$work/sorted")

{
  echo 'set terminal pngcairo size 900,600 noenhanced font "sans,10"'
  echo "set output $(gq "$out")"
  echo "set title $(gq "$title")"
  echo "set xlabel $(gq "$xlabel")"
  echo "set ylabel $(gq "$ylabel")"
  if ((linear_x)); then
    echo 'set xtics 1'
  else
    echo 'set logscale x 2'
    echo "set xtics $xtics"
  fi
  echo 'set logscale y 10'
  echo 'set format y "%g"'
  [[ -z $ytics ]] || echo "set ytics $ytics"
  echo 'set grid xtics ytics mytics lc rgb "#d8d8d8"'
  echo 'set key outside right top'
  echo 'set offsets graph 0.02, graph 0.02, 0, 0'
  printf 'plot '
  for ((i = 1; i < ${#names[@]}; i++)); do
    ((i > 1)) && printf ', \\\n     '
    style="lc $i dt 1 pt 7"
    ((pairs)) && style="lc $(((i + 1) / 2)) dt $((i % 2 ? 1 : 2)) pt $((i % 2 ? 7 : 6))"
    printf '%s using 1:%d title %s with linespoints lw 2 ps 0.8 %s' "$(gq "$work/sorted")" $((i + 1)) \
      "$(gq "${names[i]//_/ }")" "$style"
  done
  echo
} >"$work/plot.gp"

if ! gnuplot "$work/plot.gp" 2>"$work/err" || [[ ! -s $out ]]; then
  echo "plot.sh: gnuplot failed on $table:" >&2
  sed 's/^/  /' "$work/err" >&2
  exit 1
fi
# gnuplot warns (a column with no point, say) without failing: pass that on.
grep -v '^$' "$work/err" | sed 's/^/plot.sh: gnuplot: /' >&2 || true
echo "# plot: $out"
