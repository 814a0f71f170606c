# Sourced by the benchmark scripts: a scratch directory with prepared data ($W/data), removed on exit,
# and med LOG FIELD, the median of a JSON Lines field over steps 2-6 (step 1 warms caches and allocator;
# a shorter run: the middle of the steps it has from step 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
W=$(mktemp -d /tmp/llm4d-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
./train prepare /usr/share/common-licenses/GPL-3 "$W/data" >/dev/null
med() { grep '"loss"' "$1" | sed -n '2,6p' | grep -o "\"$2\":[0-9.e+-]*" | cut -d: -f2 | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
