#!/usr/bin/env bash
# Wall time of the Quickstart main job at two commits, side by side in one run, on this machine:
#
#     bash benchmarks/side_by_side.sh [BEFORE [AFTER [REPEATS]]]   # from the repository root
#
# BEFORE defaults to 5fc6b14 (an early commit), AFTER to HEAD, REPEATS to 1 (runs
# alternate before/after, so a drift in the machine's load hits both alike). Each commit is
# exported (git archive) to a scratch directory and runs
#     python -m jaxillusions.launch.sweep --config=jaxillusions/configs/dyck_small.py --workdir=<fresh directory>
# (`python -m launch.sweep --config=configs/dyck_small.py` in a commit from before the launchers
# and configs moved into the package), each from its export's root: the commit's own code.
# with the data cached (made once first, untimed) and JAX_ENABLE_COMPILATION_CACHE=false, so
# every run compiles everything. Logs and workdirs are kept under $OUT (default
# runs/side_by_side/<time>); the table ends with whether the two results.csv are identical.
# PYTHON names the interpreter (default: `python` on PATH, an activated environment's).
set -euo pipefail

before=${1:-5fc6b14}
after=${2:-HEAD}
repeats=${3:-1}
out=${OUT:-runs/side_by_side/$(date +%Y%m%dT%H%M%S)}
python=${PYTHON:-python}
config=${CONFIG:-}  # another config file: CONFIG=path (default: each commit's Quickstart config)

layout() {  # the launcher module and the Quickstart config of the export in $1
    if [ -d "$1/launch" ]; then echo "launch.sweep configs/dyck_small.py"
    else echo "jaxillusions.launch.sweep jaxillusions/configs/dyck_small.py"; fi
}

mkdir -p "$out"
out=$(cd "$out" && pwd)
for side in before after; do
    ref=${!side}
    mkdir -p "$out/$side"
    git archive "$ref" | tar -x -C "$out/$side"
    echo "$side: $(git rev-parse --short "$ref") $(git log -1 --format=%s "$ref" | cut -c1-70)"
done
echo "machine: $(lscpu | grep 'Model name' | sed 's/.*: *//'), $(nproc) cores"

# The data, once, untimed (both commits read the same cache file).
read -r _ quickstart <<< "$(layout "$out/after")"
(cd "$out/after" && "$python" -c "import runpy, sys; from jaxillusions.pipeline import validate; \
from jaxillusions.training import train; \
train.build(validate.check(runpy.run_path(sys.argv[1])['get_config']())[0])" \
    "${config:-$quickstart}" > /dev/null)

printf '%-7s %-6s %9s\n' side repeat seconds | tee "$out/times.txt"
for repeat in $(seq "$repeats"); do
    for side in before after; do
        log="$out/$side-$repeat.log"
        read -r module quickstart <<< "$(layout "$out/$side")"
        start=$(date +%s.%N)
        (cd "$out/$side" && JAX_ENABLE_COMPILATION_CACHE=false "$python" -m "$module" \
            --config="${config:-$quickstart}" --workdir="$out/runs/$side-$repeat" > "$log" 2>&1) \
            || { echo "$side run $repeat failed: see $log"; exit 1; }
        end=$(date +%s.%N)
        awk -v s="$side" -v r="$repeat" -v a="$start" -v b="$end" \
            'BEGIN {printf "%-7s %-6s %9.1f\n", s, r, b - a}' | tee -a "$out/times.txt"
    done
done

awk 'NR > 1 {s[$1] += $3; n[$1]++} END {b = s["before"] / n["before"]; a = s["after"] / n["after"];
     printf "mean: before %.1f s, after %.1f s, after/before %.0f%%\n", b, a, 100 * a / b}' \
    "$out/times.txt" | tee -a "$out/times.txt"
echo "after's breakdown: $(grep '^time ' "$out/after-1.log" || echo 'none printed')" \
    | tee -a "$out/times.txt"
if cmp -s "$out/runs/before-1/results.csv" "$out/runs/after-1/results.csv"; then
    echo "results.csv: identical" | tee -a "$out/times.txt"
else
    echo "results.csv: DIFFERENT" | tee -a "$out/times.txt"
fi
echo "logs: $out"
