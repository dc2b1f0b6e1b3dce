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
//        [--config TOKENIZER_CONFIG_JSON] FILE... [--allow-special FILE...]
//        [--add-special-tokens FILE...] [--decode IDS_FILE...]
// prints one line per file. A text FILE gives its ids, with no post-processor tokens
// (add_special_tokens false), but the files after --add-special-tokens get them (true).
// Hugging Face always matches added tokens in the text, so the files before
// --allow-special, and after --add-special-tokens, are encoded by a copy of the tokenizer
// without its added_tokens (their text is then ordinary text, which is Trident's
// default); the files after --allow-special by the tokenizer as it is. Files are read as
// bytes and decoded with the WHATWG UTF-8 decoder (ill-formed sequences become U+FFFD, a
// leading BOM is kept), as Trident's sanitize_utf8 does. An IDS_FILE after --decode holds
// ids separated by white space, and gives the text the tokenizer decodes them to
// (special tokens kept) as a JSON string. --config: a tokenizer_config.json, handed to
// the JavaScript tokenizer as Transformers.js does (its clean_up_tokenization_spaces
// decides whether decode turns " ." into "."; without it there is no clean-up); the Rust
// core has no such step. --dir defaults to $TRIDENT_VOCAB_DIR, else .cache/vocab under the
// repository.
'use strict';
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
let dir = path.resolve(process.env.TRIDENT_VOCAB_DIR || path.join(__dirname, '..', '..', '.cache', 'vocab'));
let json = '';
let engine = 'js';
let configFile = '';
let mode = 'plain';  // of the files that follow: plain, special, post, decode
const files = [];
const modes = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--dir') dir = path.resolve(args[++i]);
  else if (args[i] === '--json') json = args[++i];
  else if (args[i] === '--engine') engine = args[++i];
  else if (args[i] === '--config') configFile = args[++i];
  else if (args[i] === '--allow-special') mode = 'special';
  else if (args[i] === '--add-special-tokens') mode = 'post';
  else if (args[i] === '--decode') mode = 'decode';
  else {
    files.push(args[i]);
    modes.push(mode);
  }
}
if (!json || files.length === 0 || !['js', 'rust'].includes(engine)) {
  process.stderr.write('usage: hf_reference_encode.js --json TOKENIZER_JSON [--engine js|rust] ' +
                       '[--dir DIR] [--config TOKENIZER_CONFIG_JSON] FILE... ' +
                       '[--allow-special FILE...] [--add-special-tokens FILE...] ' +
                       '[--decode IDS_FILE...]\n');
  process.exit(2);
}

const config = JSON.parse(fs.readFileSync(json, 'utf8'));
const ordinary = {...config, added_tokens: []};
const jsConfig = configFile ? JSON.parse(fs.readFileSync(configFile, 'utf8'))
                            : {clean_up_tokenization_spaces: false};

// [ordinary, as it is]: each {encode(text, addSpecial) -> ids, decode(ids) -> text}.
async function tokenizers() {
  if (engine === 'js') {
    const {Tokenizer} = require(path.join(dir, 'huggingface-tokenizers', 'dist', 'tokenizers.cjs'));
    const make = c => {
      const t = new Tokenizer(c, jsConfig);
      return {encode: async (text, add) => t.encode(text, {add_special_tokens: add}).ids,
              decode: async ids => t.decode(ids, {skip_special_tokens: false})};
    };
    return [make(ordinary), make(config)];
  }
  const {Tokenizer} = require(path.join(dir, 'hf-tokenizers'));
  const make = c => {
    const t = Tokenizer.fromString(JSON.stringify(c));
    return {encode: async (text, add) => (await t.encode(text, null, {addSpecialTokens: add})).getIds(),
            decode: async ids => t.decode(ids, false)};
  };
  return [make(ordinary), make(config)];
}

(async () => {
  const [plain, withSpecial] = await tokenizers();
  const decoder = new TextDecoder('utf-8', {ignoreBOM: true});
  for (let i = 0; i < files.length; ++i) {
    const bytes = fs.readFileSync(files[i]);
    if (modes[i] === 'decode') {
      const ids = bytes.toString('utf8').split(/\s+/).filter(w => w.length > 0).map(Number);
      console.log(JSON.stringify(await withSpecial.decode(ids)));
      continue;
    }
    const text = decoder.decode(bytes);
    const ids = await (modes[i] === 'special' ? withSpecial : plain).encode(text, modes[i] === 'post');
    console.log(Array.from(ids).join(' '));
  }
})().catch(e => {
  process.stderr.write(`hf_reference_encode: ${e.stack || e}\n`);
  process.exit(1);
});
