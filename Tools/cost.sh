#!/usr/bin/env bash
# Ferry's cost guard: instructions per add, per run (claim + finish) and per rebuilt event,
# counted by valgrind's callgrind in a release build of Tools/ferry-cost. Instruction counts are
# repeatable where wall-clock times on a shared machine are not.
#   bash Tools/cost.sh            # print the figures and compare them with Tools/cost-baseline.txt
#   bash Tools/cost.sh --update   # write the figures to Tools/cost-baseline.txt (commit it)
#   bash Tools/cost.sh --check    # as the default, and fail when a figure is more than 10% above
#                                 # the baseline (Tools/test.sh runs this; skipped without valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=report
case "${1:-}" in
  --update) mode=update ;;
  --check) mode=check ;;
  "") ;;
  *) echo "usage: bash Tools/cost.sh [--check|--update]" >&2; exit 2 ;;
esac
baseline=Tools/cost-baseline.txt
if ! command -v valgrind >/dev/null 2>&1 || ! [ -f /usr/include/valgrind/callgrind.h ]; then
  echo "ferry: cost check skipped (valgrind and its headers are not installed)"
  exit 0
fi
echo "ferry: building the cost probe (release)..." >&2
# DWARF 4 for the C targets: valgrind 3.19 cannot read the DWARF 5 clang writes by default.
swift build -c release -Xcc -gdwarf-4 --product ferry-cost >/dev/null 2>&1 ||
  swift build -c release -Xcc -gdwarf-4 --product ferry-cost
probe=$(swift build -c release -Xcc -gdwarf-4 --show-bin-path)/ferry-cost
# Workload, and how many operations it counts over (big enough that fixed costs fade).
workloads="adds:1000 runs:1000 rebuild:100000"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A figure
for entry in $workloads; do
  name=${entry%%:*}
  count=${entry##*:}
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/$name.%p" \
    "$probe" "$name" "$count" >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
  total=$(cat "$out/$name".[0-9]* | awk '/^totals:/ { print $2; exit }')
  figure[$name]=$(( total / count ))
done
now="adds ${figure[adds]}
runs ${figure[runs]}
rebuild ${figure[rebuild]}"
echo "instructions per add (1 caller, durable):      ${figure[adds]}"
echo "instructions per run (claim + finish, serial): ${figure[runs]}"
echo "instructions per rebuilt event:                ${figure[rebuild]}"
if [ "$mode" = update ]; then
  {
    echo "# Instructions per operation (bash Tools/cost.sh --update); Tools/test.sh fails when one"
    echo "# rises more than 10% above this without this file changing in the same commit."
    echo "$now"
  } >"$baseline"
  echo "ferry: wrote $baseline"
  exit 0
fi
[ -f "$baseline" ] || { echo "ferry: no $baseline yet (bash Tools/cost.sh --update)"; exit 0; }
failed=0
while read -r name value; do
  case "$name" in "#"* | "") continue ;; esac
  current=${figure[$name]:-}
  [ -n "$current" ] || continue
  change=$(awk -v a="$current" -v b="$value" 'BEGIN { printf "%+.1f", (a - b) * 100 / b }')
  echo "  $name: $current against the baseline's $value ($change%)"
  if [ "$current" -gt $(( value + value / 10 )) ]; then
    echo "ferry: instructions per $name rose more than 10% above $baseline" >&2
    failed=1
  fi
done <"$baseline"
if [ "$mode" = check ] && [ "$failed" -ne 0 ]; then
  echo "ferry: make it cheaper, or update the baseline in the same commit (bash Tools/cost.sh --update) and say why" >&2
  exit 1
fi
