#!/usr/bin/env bash
# Layout table for the medium model: for each dp x tp x pp layout (and ZeRO stage),
# tokens/s, bytes communicated per step (measured by the communicators, summed over
# ranks) next to the analytic volume, and the measured pipeline bubble next to
# (p-1)/(m+p-1). All ranks share this machine's cores, so tokens/s compares layouts'
# overheads, not scaling.
#   bench/layout_bench.sh [steps]   (default 4; the first step is excluded from tok/s)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-4}
source bench/medium_run_setup.sh

echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; medium GPT-2 (L6 H6 C384 T256), global batch 8 x 256 tokens, micro-batch 1"
printf "# %-18s %5s %9s %14s %14s %8s %9s %9s\n" layout ranks tok/s "MiB/step meas" "MiB/step anal" ratio bubble "(p-1)/(m+p-1)"
# dp tp pp zero schedule
for layout in "1 1 1 0 1f1b" "2 1 1 0 1f1b" "2 1 1 3 1f1b" "1 2 1 0 1f1b" "1 1 2 0 1f1b" \
              "1 1 2 0 gpipe" "1 1 3 0 1f1b" "2 2 2 1 1f1b" "2 2 2 3 1f1b"; do
  read -r dp tp pp zero sched <<< "$layout"
  n=$((dp * tp * pp))
  metrics="$work/metrics_${dp}${tp}${pp}${zero}${sched}.jsonl"
  args=(train --config bench/medium.yaml --set data.train="$work/data/train_*.bin"
        --set parallel.dp="$dp" --set parallel.tp="$tp" --set parallel.pp="$pp"
        --set parallel.zero_stage="$zero" --set parallel.pipeline_schedule="$sched"
        --set training.max_steps="$steps" --set logging.metrics="$metrics"
        --set checkpoint.save_final=false)  # else the next layout resumes at max_steps
  if ((n == 1)); then
    build/trident "${args[@]}" > "$work/log" 2>&1
  else
    mpirun "${root_flag[@]}" --oversubscribe --mca btl self,vader -np "$n" \
      build/trident "${args[@]}" > "$work/log" 2>&1
  fi
  python3 - "$metrics" "$dp" "$tp" "$pp" "$zero" "$sched" <<'PY'
import json, sys
path, dp, tp, pp, zero, sched = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
steps, summary = [], None
for line in open(path):
    r = json.loads(line)
    if "summary" in r:
        summary = r["summary"]["ranks"]
    elif "loss" in r:
        steps.append(r)
tok_s = sum(s["tokens_per_s"] for s in steps[1:]) / max(1, len(steps) - 1)
meas = sum(sum(r["bytes_sent_per_step"].values()) for r in summary) / 2**20
anal = sum(sum(r["bytes_sent_per_step_analytic"].values()) for r in summary) / 2**20
bubble = sum(r["pipeline_idle_ms"] / r["pipeline_step_ms"] for r in summary) / len(summary)
m = 8 // dp
formula = (pp - 1) / (m + pp - 1)
name = f"{dp}x{tp}x{pp} z{zero}" + (f" {sched}" if pp > 1 else "")
ratio = meas / anal if anal else float("nan")
print(f"  {name:<18} {dp*tp*pp:>5} {tok_s:>9.0f} {meas:>14.2f} {anal:>14.2f} {ratio:>8.3f} {bubble:>9.3f} {formula:>9.3f}")
PY
done
