#!/usr/bin/env node
// The test oracles for Trident's tiktoken-style vocabularies, none of them code of ours
// (the packages are fetched by scripts/fetch_vocabs.sh into the vocabulary directory):
//   cl100k_base, o200k_base  npm tiktoken@1.0.22 (OpenAI's Rust tiktoken core compiled to
//                            WebAssembly): get_encoding(NAME); also gpt2, for
//                            bench/tokenizer_bench.sh
//   llama3                   the same core with Llama 3's ranks (llama3.tiktoken), special
//                            tokens and pattern as llama3-tokenizer-js@1.2.0 declares them:
//                            what Meta's tokenizer.py (tiktoken) does;
//                            --engine llama3-tokenizer-js instead runs that package's own
//                            JavaScript encoder (Hugging Face's merges and JavaScript \s;
//                            it always matches special tokens)
//
//   node bpe_reference_encode.js --encoding NAME [--dir DIR]
//        [--engine tiktoken|llama3-tokenizer-js] [--bench] FILE... [--allow-special FILE...]
// prints one line of ids per file (encode_ordinary, or encode(text, "all") for the files
// after --allow-special), or with --bench one JSON line: MB/s of encoding the files one at a
// time, single-threaded. Each file is read as bytes and decoded as UTF-8 with the WHATWG
// decoder (ill-formed sequences become U+FFFD, a leading BOM is kept), which is what
// Trident's sanitize_utf8 does before encoding. --dir defaults to $TRIDENT_VOCAB_DIR,
// else .cache/vocab under the repository.
'use strict';
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
let dir = path.resolve(process.env.TRIDENT_VOCAB_DIR || path.join(__dirname, '..', '..', '.cache', 'vocab'));
let encoding = '';
let engine = 'tiktoken';
let bench = false;
let allowSpecial = false;
const files = [];
const special = [];  // [file]: encode with special tokens allowed
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--dir') dir = path.resolve(args[++i]);
  else if (args[i] === '--encoding') encoding = args[++i];
  else if (args[i] === '--engine') engine = args[++i];
  else if (args[i] === '--bench') bench = true;
  else if (args[i] === '--allow-special') allowSpecial = true;
  else {
    files.push(args[i]);
    special.push(allowSpecial);
  }
}
if (!['gpt2', 'cl100k_base', 'o200k_base', 'llama3'].includes(encoding) || files.length === 0 ||
    !['tiktoken', 'llama3-tokenizer-js'].includes(engine)) {
  process.stderr.write('usage: bpe_reference_encode.js --encoding gpt2|cl100k_base|o200k_base|llama3 ' +
                       '[--dir DIR] [--allow-special] [--engine tiktoken|llama3-tokenizer-js] ' +
                       '[--bench] FILE...\n');
  process.exit(2);
}

let encode;
if (engine === 'llama3-tokenizer-js') {
  if (encoding !== 'llama3') throw new Error('--engine llama3-tokenizer-js is for llama3 only');
  const {llama3Tokenizer} = require(path.join(
      dir, 'llama3-tokenizer-js', 'bundle', 'commonjs-llama3-tokenizer-with-baked-data.cjs'));
  encode = t => llama3Tokenizer.encode(t, {bos: false, eos: false});
} else {
  let enc;
  if (encoding === 'llama3') {
    const {Tiktoken} = require(path.join(dir, 'tiktoken', 'lite', 'tiktoken.cjs'));
    const pkg = path.join(dir, 'llama3-tokenizer-js');
    const source = fs.readFileSync(path.join(pkg, 'src', 'llama3-tokenizer.js'), 'utf8');
    const pattern = JSON.parse(source.match(/const DIRTY_LLAMA3_REGEX_STRING = (".*")/)[1]);
    const {llama3Tokenizer} =
        require(path.join(pkg, 'bundle', 'commonjs-llama3-tokenizer-with-baked-data.cjs'));
    const vocab = llama3Tokenizer.vocabById;
    const special = {};
    for (let id = vocab.length - 256; id < vocab.length; ++id) special[vocab[id]] = id;
    enc = new Tiktoken(fs.readFileSync(path.join(dir, 'llama3.tiktoken'), 'utf8'), special, pattern);
  } else {
    enc = require(path.join(dir, 'tiktoken', 'tiktoken.cjs')).get_encoding(encoding);
  }
  encode = (t, allow) => allow ? enc.encode(t, 'all') : enc.encode_ordinary(t);
}

const decoder = new TextDecoder('utf-8', {ignoreBOM: true});
const texts = files.map(f => decoder.decode(fs.readFileSync(f)));
if (bench) {
  const bytes = files.reduce((n, f) => n + fs.statSync(f).size, 0);
  encode(texts[0]);  // compile and warm up, as Trident's table reports its best repetition
  let best = Infinity, tokens = 0;
  for (let rep = 0; rep < 3; ++rep) {
    const start = process.hrtime.bigint();
    tokens = 0;
    for (const t of texts) tokens += encode(t).length;
    best = Math.min(best, Number(process.hrtime.bigint() - start) / 1e9);
  }
  console.log(JSON.stringify({encoding, engine, bytes, tokens, best_s: best, mb_per_s: bytes / 1e6 / best}));
} else {
  texts.forEach((t, i) => console.log(Array.from(encode(t, special[i])).join(' ')));
}
