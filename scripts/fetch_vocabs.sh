#!/usr/bin/env bash
# fetch_vocabs.sh [DIR] — the tiktoken rank files of `trident prepare --tokenizer
# cl100k_base|o200k_base|llama3`, and the npm packages that are their test oracles.
#
#   npm pack tiktoken@1.0.22 (MIT; OpenAI's tiktoken, its Rust core compiled to
#     WebAssembly): encoders/{cl100k,o200k}_base.json hold the ranks, converted here to
#     cl100k_base.tiktoken and o200k_base.tiktoken, which must be byte-identical to
#     OpenAI's files: the SHA-256 below are the ones tiktoken itself checks
#     (tiktoken_ext/openai_public.py, expected_hash).
#   npm pack llama3-tokenizer-js@1.2.0 (MIT): its vocabulary, converted to llama3.tiktoken
#     (ranks 0..127999, the special tokens 128000.. are not in the file), which must be
#     byte-identical to Meta's Llama 3 / 3.1 original/tokenizer.model (SHA-256 below).
#   Hugging Face tokenizer.json files for GPT-2 and Llama 3, built by
#     tests/reference/make_tokenizer_json.js from GPT-2's encoder.json + vocab.bpe
#     (scripts/fetch_gpt2_vocab.sh, run here) and from the vocabulary and merge list that
#     llama3-tokenizer-js carries from Meta's tokenizer.json (the script also derives the
#     merges from the ranks as Hugging Face's converter does and fails unless they are the
#     same); checked by SHA-256, since the build is deterministic.
#   npm pack @huggingface/tokenizers@0.2.0 (Apache-2.0; Hugging Face's JavaScript
#     implementation) and tokenizers@0.23.2 (Apache-2.0; the Rust tokenizers crate as a
#     Node binding, prebuilt in the package): the oracles of the tokenizer.json reader.
# Leaves in DIR:
#   cl100k_base.tiktoken, o200k_base.tiktoken, llama3.tiktoken   what Trident loads
#   gpt2.tokenizer.json, llama3.tokenizer.json                   the same, as tokenizer.json
#   tiktoken/, llama3-tokenizer-js/,  the whole npm packages (tests/reference/
#   huggingface-tokenizers/,          bpe_reference_encode.js and hf_reference_encode.js
#   hf-tokenizers/                    run them)
# DIR: the argument, else $TRIDENT_VOCAB_DIR, else .cache/vocab under the repository.
# Idempotent: files already there with the right hashes are kept. Exits non-zero when
# the files cannot be fetched or do not match.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${TRIDENT_VOCAB_DIR:-$repo/.cache/vocab}}

readonly CL100K_SHA256=223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7
readonly O200K_SHA256=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d
readonly LLAMA3_SHA256=82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55
readonly GPT2_JSON_SHA256=a2a37ca97361c19d513ab391851b4a71424f7f54e1b5d5c6ebc460195cc060da
readonly LLAMA3_JSON_SHA256=64ce3fe0bc608dcff769edf7e3ae10397917e34e6999a2f6e7a30435c00aa96f
readonly TIKTOKEN=tiktoken@1.0.22 LLAMA3_JS=llama3-tokenizer-js@1.2.0
# npm package, the directory it goes to, the name of the file npm pack writes.
readonly HF_PACKAGES=("@huggingface/tokenizers@0.2.0 huggingface-tokenizers huggingface-tokenizers-0.2.0.tgz"
                      "tokenizers@0.23.2 hf-tokenizers tokenizers-0.23.2.tgz")
gpt2_dir=${TRIDENT_GPT2_DIR:-$repo/.cache/gpt2}

hash_ok() { [[ -f $1 ]] && [[ $(sha256sum "$1" | cut -d' ' -f1) == "$2" ]]; }
have_all() {
  hash_ok "$dir/cl100k_base.tiktoken" $CL100K_SHA256 &&
    hash_ok "$dir/o200k_base.tiktoken" $O200K_SHA256 &&
    hash_ok "$dir/llama3.tiktoken" $LLAMA3_SHA256 &&
    hash_ok "$dir/gpt2.tokenizer.json" $GPT2_JSON_SHA256 &&
    hash_ok "$dir/llama3.tokenizer.json" $LLAMA3_JSON_SHA256 &&
    [[ -f $dir/tiktoken/package.json && -f $dir/llama3-tokenizer-js/package.json &&
       -f $dir/huggingface-tokenizers/package.json && -f $dir/hf-tokenizers/package.json ]]
}
fail() { echo "fetch_vocabs: $*" >&2; exit 1; }

if have_all; then
  echo "fetch_vocabs: $dir already has cl100k_base, o200k_base, llama3 and the tokenizer.json files"
  exit 0
fi
command -v npm >/dev/null || fail "npm not found"
command -v node >/dev/null || fail "node not found"
"$repo/scripts/fetch_gpt2_vocab.sh" "$gpt2_dir" || fail "GPT-2's files (scripts/fetch_gpt2_vocab.sh) are needed for gpt2.tokenizer.json"
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for pkg in $TIKTOKEN $LLAMA3_JS; do
  name=${pkg%@*}
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null) || fail "npm pack $pkg failed"
  mkdir -p "$tmp/$name"
  tar -xzf "$tmp/$name-${pkg#*@}.tgz" -C "$tmp/$name" --strip-components=1
done
for entry in "${HF_PACKAGES[@]}"; do
  read -r pkg name tgz <<<"$entry"
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null) || fail "npm pack $pkg failed"
  mkdir -p "$tmp/$name"
  tar -xzf "$tmp/$tgz" -C "$tmp/$name" --strip-components=1
done
# tokenizers ships a native binding per platform (5 MB each); Linux's are the ones used.
find "$tmp/hf-tokenizers" -name 'tokenizers.*.node' ! -name 'tokenizers.linux-*' -delete

# tiktoken's encoders/*.json: "bpe_ranks" is lines of "<ignored> <first rank> <base64>...",
# the tokens of consecutive ranks; a rank file is "<base64> <rank>\n" by rank.
for enc in cl100k_base o200k_base; do
  node - "$tmp/tiktoken/encoders/$enc.json" "$tmp/$enc.tiktoken" <<'EOF' || fail "converting $enc failed"
const fs = require('fs');
const [src, dst] = process.argv.slice(2);
const byRank = [];
for (const line of JSON.parse(fs.readFileSync(src, 'utf8')).bpe_ranks.split('\n')) {
  if (!line) continue;
  const [, first, ...tokens] = line.split(' ');
  tokens.forEach((t, i) => { byRank[Number(first) + i] = t; });
}
const out = [];
for (let r = 0; r < byRank.length; ++r) {
  if (byRank[r] === undefined) throw new Error(`${src}: no token of rank ${r}`);
  out.push(`${byRank[r]} ${r}\n`);
}
fs.writeFileSync(dst, out.join(''));
EOF
done
# llama3-tokenizer-js: vocabById[id] is Hugging Face's byte-level string of the token
# (GPT-2's bytes_to_unicode), the last 256 entries the special tokens.
node "$repo/tests/reference/make_tokenizer_json.js" llama3-ranks "$tmp" "$tmp/llama3.tiktoken" ||
  fail "converting llama3 failed"
node "$repo/tests/reference/make_tokenizer_json.js" gpt2 "$gpt2_dir" "$tmp/gpt2.tokenizer.json" ||
  fail "building gpt2.tokenizer.json failed"
node "$repo/tests/reference/make_tokenizer_json.js" llama3 "$tmp" "$tmp/llama3.tokenizer.json" ||
  fail "building llama3.tokenizer.json failed"
hash_ok "$tmp/gpt2.tokenizer.json" $GPT2_JSON_SHA256 || fail "gpt2.tokenizer.json does not have the expected SHA-256"
hash_ok "$tmp/llama3.tokenizer.json" $LLAMA3_JSON_SHA256 || fail "llama3.tokenizer.json does not have the expected SHA-256"
hash_ok "$tmp/cl100k_base.tiktoken" $CL100K_SHA256 || fail "cl100k_base.tiktoken does not have OpenAI's SHA-256"
hash_ok "$tmp/o200k_base.tiktoken" $O200K_SHA256 || fail "o200k_base.tiktoken does not have OpenAI's SHA-256"
hash_ok "$tmp/llama3.tiktoken" $LLAMA3_SHA256 || fail "llama3.tiktoken does not have Meta's tokenizer.model SHA-256"
# Stage, then rename, so an interrupted run never leaves files that look complete.
for name in tiktoken llama3-tokenizer-js huggingface-tokenizers hf-tokenizers; do
  rm -rf "$dir/$name"
  mv "$tmp/$name" "$dir/$name"
done
for f in cl100k_base.tiktoken o200k_base.tiktoken llama3.tiktoken gpt2.tokenizer.json llama3.tokenizer.json; do
  cp "$tmp/$f" "$dir/$f.tmp" && mv "$dir/$f.tmp" "$dir/$f"
done
echo "fetch_vocabs: cl100k_base, o200k_base ($TIKTOKEN), llama3 ($LLAMA3_JS), gpt2 and llama3 tokenizer.json in $dir"
