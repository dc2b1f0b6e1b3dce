#!/usr/bin/env bash
# Runs the Trident and PyTorch training-step benchmarks on the same presets, batch and
# thread count, alternating (two rounds by default) so that machine noise shows, and
# prints both tables, then per round the ratio of their tokens/s (both from the median
# step; see bench/bench_model.cpp). Each round starts and ends with the load average and
# the CPU pressure, since another process on the machine slows either side.
#   bench/model_bench.sh [threads [rounds]]   (defaults: all cores, 2 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
rounds=${2:-2}
[[ -x build/bench/bench_model ]] || cmake --build build --target bench_model
load() {
  local psi=""
  [[ -r /proc/pressure/cpu ]] && psi=" | cpu pressure $(head -n1 /proc/pressure/cpu | cut -d' ' -f2-4)"
  echo "$(date -u +%T) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)$psi"
}
# The CPU, its vector width, and whether the cores are SMT siblings (two vCPUs on one
# physical core share its FMA units and caches, which changes what threading buys).
lscpu_field() { lscpu 2>/dev/null | sed -n "s/^$1: *//p" | head -n1; }
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores" \
     "($(lscpu_field 'Thread(s) per core') threads per core)," \
     "$(grep -o -w -m1 'avx512f' /proc/cpuinfo || echo 'no avx512f')," \
     "$(grep -o -w -m1 'avx2' /proc/cpuinfo || echo 'no avx2')"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for round in $(seq "$rounds"); do
  echo "# round $round: $(load)"
  build/bench/bench_model --threads "$threads" --steps 10 | tee "$out/trident"
  /usr/bin/python3 bench/torch_model.py --threads "$threads" --steps 10 | tee "$out/torch"
  # tokens/s is column 6 of Trident's rows and column 5 of PyTorch's.
  ratios=$(awk 'FNR == 1 { file++ } /^#/ { next }
                file == 1 { t[$1] = $6; order[++n] = $1 }
                file == 2 { p[$1] = $5 }
                END { for (i = 1; i <= n; i++) if (p[order[i]] > 0)
                        printf " %s %.2fx", order[i], t[order[i]] / p[order[i]] }' \
                "$out/trident" "$out/torch")
  echo "# round $round: trident / pytorch tokens/s:$ratios; end $(load)"
done
