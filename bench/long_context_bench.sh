#!/usr/bin/env bash
# Long context under context parallelism (parallel.cp): for cp 1, 2 and 4,
#   1. the largest model.seq_len whose memory plan fits a fixed per-rank budget
#      (`trident plan`'s configured layout; the plan equals the trainer's allocations at
#      cp 1/2/4, tests/plan/memory_plan_mpi_test.cpp), and
#   2. the step time at one length every cp can run, measured by training a few steps
#      (one sequence per step, so cp is the only thing that splits the work), with the
#      largest activation bytes a rank held (the metrics summary) beside the plan's.
#   3. the step time at cp 2 with the ring overlapped (the default) and blocking
#      (TRIDENT_RING_OVERLAP=0), `pairs` pairs of runs (which runs first alternates), with the metrics'
#      comm_exposed_ms.cp and comm_hidden_ms.cp (medians over the steps after the first).
# All ranks share this machine's cores (cp ranks get cores / cp threads each; cp 4 on a
# 2-core machine is oversubscribed), so the step times compare cp's overheads, not scaling.
#   bench/long_context_bench.sh [budget_mib [seq_len [steps [pairs]]]]  (defaults 512, 2048,
#   4, 3); LONG_CONTEXT_TABLES=overlap runs the third table alone.
set -euo pipefail
cd "$(dirname "$0")/.."
budget_mib=${1:-512}
run_len=${2:-2048}
steps=${3:-4}
pairs=${4:-3}
source bench/medium_run_setup.sh

# A small llama (RoPE, GQA 4/2 heads) with byte tokens: attention's share of the step grows
# with the length, which is what context parallelism splits.
model=(--set model.arch=llama --set model.vocab_size=256 --set model.n_layers=4
       --set model.n_heads=4 --set model.n_kv_heads=2 --set model.d_model=128
       --set model.d_ff=352 --set parallel.micro_batch_size=1
       --set training.global_batch_size=1 --set data.train="$work/data/train_*.bin")
plan_bytes() {  # cp seq_len kind -> the configured layout's planned bytes per rank of kind
  build/trident plan --config bench/medium.yaml --devices "$1" --gpu cpu --json "${model[@]}" \
    --set parallel.cp="$1" --set model.seq_len="$2" |
    python3 -c 'import json, sys; print(int(json.load(sys.stdin)["configured"]["memory_bytes"][sys.argv[1]]))' "$3"
}
plan_total() { plan_bytes "$1" "$2" total; }
budget=$((budget_mib * 1024 * 1024))
# The median step and cp ring times of a metrics file (the steps after the first).
medians() {
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "loss" in r]
later = steps[1:] or steps
med = lambda v: sorted(v)[len(v) // 2]
print(f'{med([r["step_ms"] for r in later]):.1f}',
      f'{med([r["comm_exposed_ms"]["cp"] for r in later]):.1f}',
      f'{med([r["comm_hidden_ms"]["cp"] for r in later]):.1f}')
PY
}
overlap_table() {
  echo "# cp 2 at seq_len $run_len ($steps steps, the first excluded): ring overlapped vs blocking, $pairs pairs of runs"
  printf "# %4s %8s %10s %16s %15s\n" run overlap "ms/step" "cp exposed ms" "cp hidden ms"
  for pair in $(seq "$pairs"); do
    order="1 0"; ((pair % 2)) || order="0 1"  # alternate which runs first
    for overlap in $order; do
      metrics="$work/metrics_overlap$overlap.jsonl"
      rm -f "$metrics"
      mpirun "${root_flag[@]}" --oversubscribe --mca btl self,vader -np 2 -x TRIDENT_RING_OVERLAP="$overlap" \
        build/trident train --config bench/medium.yaml "${model[@]}" \
        --set model.seq_len="$run_len" --set parallel.cp=2 --set runtime.threads=1 \
        --set training.max_steps="$steps" --set logging.metrics="$metrics" \
        --set checkpoint.save_final=false > "$work/log" 2>&1 || { cat "$work/log"; exit 1; }
      read -r ms exposed hidden < <(medians "$metrics")
      printf "  %4d %8s %10s %16s %15s\n" "$pair" "$( ((overlap)) && echo on || echo off)" "$ms" "$exposed" "$hidden"
    done
  done
}
if [[ "${LONG_CONTEXT_TABLES:-}" == overlap ]]; then
  echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  overlap_table
  exit 0
fi
echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# model: llama L4 H4 KV2 C128 byte vocabulary, micro-batch 1; budget ${budget_mib} MiB per rank"
printf "# %3s %12s %16s %14s\n" cp "max seq_len" "planned MiB/rank" "vs cp 1"
max1=0
for cp in 1 2 4; do
  quantum=$((2 * cp * 128))  # a multiple of 2 cp (the chunks), in steps of 128 positions
  lo=0 hi=$quantum
  while (( $(plan_total "$cp" "$hi") <= budget )); do lo=$hi; hi=$((hi * 2)); done
  while (( hi - lo > quantum )); do  # lo fits, hi does not
    mid=$(( (lo + hi) / 2 / quantum * quantum ))
    if (( $(plan_total "$cp" "$mid") <= budget )); then lo=$mid; else hi=$mid; fi
  done
  ((cp == 1)) && max1=$lo
  mib=$(python3 -c "print(f'{$(plan_total "$cp" "$lo") / 2**20:.1f}')")
  printf "  %3d %12d %16s %13.2fx\n" "$cp" "$lo" "$mib" "$(python3 -c "print($lo / $max1)")"
done

echo "# step time at seq_len $run_len ($steps steps, the first excluded), one sequence per step"
printf "# %3s %5s %8s %10s %9s %22s %21s\n" cp ranks threads "ms/step" "vs cp 1" "activations MiB, held" "activations MiB, plan"
base=0
for cp in 1 2 4; do
  threads=$(( $(nproc) / cp )); ((threads >= 1)) || threads=1
  metrics="$work/metrics_cp$cp.jsonl"
  args=(train --config bench/medium.yaml "${model[@]}"
        --set model.seq_len="$run_len" --set parallel.cp="$cp" --set runtime.threads="$threads"
        --set training.max_steps="$steps" --set logging.metrics="$metrics"
        --set checkpoint.save_final=false)
  if ((cp == 1)); then
    build/trident "${args[@]}" > "$work/log" 2>&1 || { cat "$work/log"; exit 1; }
  else
    mpirun "${root_flag[@]}" --oversubscribe --mca btl self,vader -np "$cp" \
      build/trident "${args[@]}" > "$work/log" 2>&1 || { cat "$work/log"; exit 1; }
  fi
  planned=$(plan_bytes "$cp" "$run_len" activations)
  read -r ms mib < <(python3 - "$metrics" <<'PY'
import json, sys
steps, summary = [], None
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "summary" in r:
        summary = r["summary"]["ranks"]
    elif "loss" in r:
        steps.append(r["step_ms"])
later = sorted(steps[1:]) or steps
ms = later[len(later) // 2]
mem = max(r["activation_bytes"] for r in summary) / 2**20 if summary else float("nan")
print(f"{ms:.1f} {mem:.1f}")
PY
)
  ((cp == 1)) && base=$ms
  printf "  %3d %5d %8d %10s %8.2fx %22s %21.1f\n" "$cp" "$cp" "$threads" "$ms" \
    "$(python3 -c "print($ms / $base)")" "$mib" "$(python3 -c "print($planned / 2**20)")"
done
overlap_table
