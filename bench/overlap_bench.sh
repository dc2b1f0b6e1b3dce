#!/usr/bin/env bash
# Overlap (parallel.overlap_grad_reduce and overlap_param_gather together), on vs off, in one run: the medium model (bench/medium.yaml)
# at dp 2 with ZeRO-1 and ZeRO-3, alternating on and off `rounds` times, printing per
# configuration the mean step time (first step excluded) and rank 0's dp communication
# time per step, exposed (the compute waited) and hidden (ran behind compute), from the
# metrics file (Communicator::times()). Both ranks share this machine's cores.
#   bench/overlap_bench.sh [steps] [rounds]   (defaults 5 and 2)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-5}
rounds=${2:-2}
source bench/medium_run_setup.sh
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); medium GPT-2 (L6 H6 C384 T256), dp 2, global batch 8 x 256 tokens, micro-batch 1 (4 per rank per step)"
printf "# %-5s %-4s %-8s %10s %14s %13s %10s\n" round zero overlap "ms/step" "dp exposed ms" "dp hidden ms" "loss last"
for round in $(seq "$rounds"); do
  for zero in 1 3; do
    for overlap in true false; do
      metrics="$work/m_${round}_${zero}_${overlap}.jsonl"
      mpirun "${root_flag[@]}" --oversubscribe --mca btl self,vader -np 2 \
        build/trident train --config bench/medium.yaml --set data.train="$work/data/train_*.bin" \
        --set parallel.dp=2 --set parallel.zero_stage="$zero" \
        --set parallel.overlap_grad_reduce="$overlap" --set parallel.overlap_param_gather="$overlap" \
        --set training.max_steps="$steps" \
        --set logging.metrics="$metrics" --set checkpoint.dir="$work/ck_${round}_${zero}_${overlap}" \
        --set checkpoint.save_final=false \
        > "$work/log" 2>&1 || { cat "$work/log"; exit 1; }
      python3 - "$metrics" "$round" "$zero" "$overlap" <<'PY'
import json, sys
path, rnd, zero, overlap = sys.argv[1:5]
steps = [r for r in map(json.loads, open(path)) if "loss" in r][1:]
mean = lambda xs: sum(xs) / max(1, len(xs))
print(f"  {rnd:<5} {zero:<4} {overlap:<8} {mean([s['step_ms'] for s in steps]):10.1f} "
      f"{mean([s['comm_exposed_ms']['dp'] for s in steps]):14.1f} "
      f"{mean([s['comm_hidden_ms']['dp'] for s in steps]):13.1f} {steps[-1]['loss']:10.6f}")
PY
    done
  done
done
