#!/usr/bin/env bash
# The demo: installs what is missing (only what the demo needs: scripts/setup.sh --demo),
# builds the `trident` target only (no CUDA plugin, no tests), prepares a real English
# corpus with the byte tokenizer, and trains configs/tiny.yaml on 8 CPU ranks with 3D
# parallelism:
# data parallel 2 x tensor parallel 2 x pipeline parallel 2, ZeRO stage 3 (FSDP).
# Extra arguments go to `trident train` (e.g. --set training.max_steps=50).
# TRIDENT_DEMO_RANKS=1 trains the same model in one process instead.
# It ends by plotting the metrics into runs/demo/metrics.png (scripts/plot_metrics.py)
# and printing a sample from the final checkpoint (`trident generate`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo trident

RUN_DIR=runs/demo
mkdir -p "$RUN_DIR"
if [[ ! -f "$RUN_DIR/data/train_000000.bin" ]]; then
  scripts/fetch_corpus.sh "$RUN_DIR/corpus"
  mapfile -t texts < <(find "$RUN_DIR/corpus" -name '*.txt' | sort)
  build/trident prepare --input "${texts[@]}" --out "$RUN_DIR/data" --tokenizer byte \
    | tee "$RUN_DIR/prepare.log"
fi
# A fresh run each time: old metrics and checkpoints would mix with the new ones.
rm -rf "$RUN_DIR/metrics.jsonl" "$RUN_DIR/checkpoints"
ranks=${TRIDENT_DEMO_RANKS:-8}
if [[ $ranks == 1 ]]; then
  build/trident train --config configs/tiny.yaml "$@"
else
  # 8 ranks share the machine's cores: --oversubscribe, and one OpenMP thread each.
  root_flag=()
  if [[ $(id -u) -eq 0 ]]; then root_flag=(--allow-run-as-root); fi
  mpirun "${root_flag[@]}" --oversubscribe --mca btl self,vader -np 8 \
    build/trident train --config configs/tiny.yaml \
    --set parallel.dp=2 --set parallel.tp=2 --set parallel.pp=2 --set parallel.zero_stage=3 \
    --set parallel.micro_batch_size=2 "$@"
fi

entropy=$(grep -o 'unigram entropy: [0-9.]*' "$RUN_DIR/prepare.log" | awk '{print $3}' || true)
val=$(grep -o '"val_loss":[0-9.]*' "$RUN_DIR/metrics.jsonl" | tail -1 | cut -d: -f2 || true)
echo
/usr/bin/python3 scripts/plot_metrics.py "$RUN_DIR/metrics.jsonl" --out "$RUN_DIR/metrics.png"
echo "sample from the final checkpoint (temperature 0.8, top-k 40, seed 1):"
echo "----"
build/trident generate --checkpoint "$RUN_DIR/checkpoints" --prompt "The people of the" \
  --max-new-tokens 100 --temperature 0.8 --top-k 40 --seed 1 2>/dev/null
echo "----"
echo "metrics: $RUN_DIR/metrics.jsonl (one JSON object per step), plotted in $RUN_DIR/metrics.png"
echo "checkpoints: $RUN_DIR/checkpoints (build/trident ckpt inspect $RUN_DIR/checkpoints)"
if [[ -n "$entropy" && -n "$val" ]]; then
  echo "final validation loss ${val} nats/token vs. the corpus's unigram entropy ${entropy} nats/token"
fi
