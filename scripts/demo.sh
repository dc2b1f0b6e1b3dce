#!/usr/bin/env bash
# The demo: installs what is missing, builds, prepares a real English corpus with the
# byte tokenizer, and trains configs/tiny.yaml on this machine's CPU cores.
# Extra arguments go to `trident train` (e.g. --set training.max_steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh trident

RUN_DIR=runs/demo
mkdir -p "$RUN_DIR"
if [[ ! -f "$RUN_DIR/data/train_000000.bin" ]]; then
  scripts/fetch_corpus.sh "$RUN_DIR/corpus"
  mapfile -t texts < <(find "$RUN_DIR/corpus" -name '*.txt' | sort)
  build/trident prepare --input "${texts[@]}" --out "$RUN_DIR/data" --tokenizer byte \
    | tee "$RUN_DIR/prepare.log"
fi
rm -f "$RUN_DIR/metrics.jsonl"
build/trident train --config configs/tiny.yaml "$@"

entropy=$(grep -o 'unigram entropy: [0-9.]*' "$RUN_DIR/prepare.log" | awk '{print $3}' || true)
val=$(grep -o '"val_loss":[0-9.]*' "$RUN_DIR/metrics.jsonl" | tail -1 | cut -d: -f2 || true)
echo
echo "metrics: $RUN_DIR/metrics.jsonl (one JSON object per step; plot with your tool of choice)"
if [[ -n "$entropy" && -n "$val" ]]; then
  echo "final validation loss ${val} nats/token vs. the corpus's unigram entropy ${entropy} nats/token"
fi
