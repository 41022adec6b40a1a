#!/usr/bin/env bash
# The GPU measurements of README "Speed", in parts that each fit in about 10 minutes on one H100:
#
#   bash benchmarks/gpu.sh smoke       # versions; the Dyck demo end to end (1 min 39 s on an H100,
#                                      # empty cache), then again from the cache (26 s)
#   bash benchmarks/gpu.sh reference   # benchmark of the reference model, 1-256 seeds
#   bash benchmarks/gpu.sh paper       # benchmark and profile of the dyck config's model
#   bash benchmarks/gpu.sh sweep       # the dyck config end to end with 32 seeds (timed; with
#                                      # deterministic kernels its training alone took 12.4 min
#                                      # on an H100, more than one 10-minute call; at the default
#                                      # kernels' rate about 3.7 min, with
#                                      # GPU_SWEEP_ARGS=--config.gpu_deterministic=false)
#
# Logs and JSON go to $OUT (default runs/gpu). Run from the repository root with the project
# installed (or on PYTHONPATH): `python -m jaxillusions` is the `jaxillusions` command.
set -euo pipefail
out=${OUT:-runs/gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
log() { tee "$out/$1.log" | grep -v -E '^(dyck data|W[0-9]{4} )'; }

case ${1:-} in
  smoke)
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
    python -c "import jax, torch; print('jax', jax.__version__, jax.devices(), 'torch', \
torch.__version__)"
    { time python -m jaxillusions sweep --config=dyck_small --workdir="$out/smoke" \
        --config.train.num_steps=1000; } 2>&1 | log smoke | tail -4
    # The same job again: its programs now come from the persistent compilation cache.
    { time python -m jaxillusions sweep --config=dyck_small --workdir="$out/smoke_again" \
        --config.train.num_steps=1000; } 2>&1 | log smoke_again | tail -4
    cmp "$out/smoke/results.csv" "$out/smoke_again/results.csv" && echo "results.csv identical" ;;
  reference)
    python -m jaxillusions benchmark --seeds=1,8,32,128,256 --loop_max_seeds=8 --bfloat16 \
      --proxy_seeds=256 --proxy_batch_size=256 --out="$out/reference.json" 2>&1 | log reference ;;
  paper)
    python -m benchmarks.profile --config=dyck --seeds=128 2>&1 | log profile | head -24
    python -m jaxillusions benchmark --config=dyck --seeds=8,128,256 --loop_max_seeds=8 \
      --steps=10 --repeats=2 --bfloat16 --no_kmeans --proxy_seeds=256 --proxy_batch_size=256 \
      --out="$out/paper.json" 2>&1 | log paper ;;
  sweep)
    { time python -m jaxillusions sweep --config=dyck --workdir="$out/sweep" \
        --config.train.num_seeds=32 ${GPU_SWEEP_ARGS:-}; } 2>&1 | log sweep | tail -30 ;;
  *)
    echo "usage: bash benchmarks/gpu.sh smoke|reference|paper|sweep" >&2
    exit 2 ;;
esac
