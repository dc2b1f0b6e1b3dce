#!/usr/bin/env bash
# Runs the Trident and PyTorch training-step benchmarks on the same presets, batch and
# thread count, alternating twice so that machine noise shows, and prints both tables.
#   bench/model_bench.sh [threads]   (default: all cores)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
[[ -x build/bench/bench_model ]] || cmake --build build --target bench_model
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
for round in 1 2; do
  echo "# round $round"
  build/bench/bench_model --threads "$threads" --steps 10
  /usr/bin/python3 bench/torch_model.py --threads "$threads" --steps 10
done
