#!/usr/bin/env node
// The test oracles for Trident's Hugging Face tokenizer.json reader, none of them code of
// ours (scripts/fetch_vocabs.sh fetches both packages into the vocabulary directory):
//   --engine js    npm @huggingface/tokenizers@0.2.0: Hugging Face's own JavaScript
//                  implementation (Tokenizers.js, the one Transformers.js uses). Its regex
//                  is JavaScript's: \s has U+FEFF and lacks U+0085, and (?i:'s|...) is
//                  rewritten to ASCII case pairs, so 'ſ is no contraction there.
//   --engine rust  npm tokenizers@0.23.2: the Rust `tokenizers` crate itself (Node binding,
//                  prebuilt inside the package), whose \s is Unicode White_Space, as
//                  Trident's is.
//
//   node hf_reference_encode.js --json TOKENIZER_JSON [--engine js|rust] [--dir DIR]
//        FILE... [--allow-special FILE...]
// prints one line of ids per file, with no post-processor tokens (add_special_tokens
// false). Hugging Face always matches added tokens in the text, so the files before
// --allow-special are encoded by a copy of the tokenizer without its added_tokens (their
// text is then ordinary text, which is Trident's default); the files after it by the
// tokenizer as it is. Files are read as bytes and decoded with the WHATWG UTF-8 decoder
// (ill-formed sequences become U+FFFD, a leading BOM is kept), as Trident's sanitize_utf8
// does. --dir defaults to $TRIDENT_VOCAB_DIR, else .cache/vocab under the repository.
'use strict';
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
let dir = path.resolve(process.env.TRIDENT_VOCAB_DIR || path.join(__dirname, '..', '..', '.cache', 'vocab'));
let json = '';
let engine = 'js';
let allowSpecial = false;
const files = [];
const special = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--dir') dir = path.resolve(args[++i]);
  else if (args[i] === '--json') json = args[++i];
  else if (args[i] === '--engine') engine = args[++i];
  else if (args[i] === '--allow-special') allowSpecial = true;
  else {
    files.push(args[i]);
    special.push(allowSpecial);
  }
}
if (!json || files.length === 0 || !['js', 'rust'].includes(engine)) {
  process.stderr.write('usage: hf_reference_encode.js --json TOKENIZER_JSON [--engine js|rust] ' +
                       '[--dir DIR] FILE... [--allow-special FILE...]\n');
  process.exit(2);
}

const config = JSON.parse(fs.readFileSync(json, 'utf8'));
const ordinary = {...config, added_tokens: []};

async function encoders() {
  if (engine === 'js') {
    const {Tokenizer} = require(path.join(dir, 'huggingface-tokenizers', 'dist', 'tokenizers.cjs'));
    const make = c => {
      const t = new Tokenizer(c, {});
      return async text => t.encode(text, {add_special_tokens: false}).ids;
    };
    return [make(ordinary), make(config)];
  }
  const {Tokenizer} = require(path.join(dir, 'hf-tokenizers'));
  const make = c => {
    const t = Tokenizer.fromString(JSON.stringify(c));
    return async text => (await t.encode(text, null, {addSpecialTokens: false})).getIds();
  };
  return [make(ordinary), make(config)];
}

(async () => {
  const [plain, withSpecial] = await encoders();
  const decoder = new TextDecoder('utf-8', {ignoreBOM: true});
  for (let i = 0; i < files.length; ++i) {
    const text = decoder.decode(fs.readFileSync(files[i]));
    const ids = await (special[i] ? withSpecial : plain)(text);
    console.log(Array.from(ids).join(' '));
  }
})().catch(e => {
  process.stderr.write(`hf_reference_encode: ${e.stack || e}\n`);
  process.exit(1);
});
