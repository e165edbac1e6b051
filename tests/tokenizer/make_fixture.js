#!/usr/bin/env node
// tests/tokenizer/make_fixture.js — writes fixture_dsv3.json, the small hand-made tokenizer.json in the
// DeepSeek-V3 layout that the parity test uses next to a tokenizer trained by trex:
//   - specials first (<｜begin▁of▁sentence｜> 0, <｜end▁of▁sentence｜> 1, <｜▁pad▁｜> 2), then the 256
//     byte tokens, then hand-picked merges in the legacy "a b" string form;
//   - the chat tokens at ids after a hole in the id range (as in V3, where they sit at 128800+),
//     <think> and </think> as normalized, non-special tokens (the second added-token pass), and one
//     extra token with lstrip and rstrip;
//   - V3's normalizer (an empty Sequence), pre-tokenizer (three Splits + ByteLevel), post-processor
//     (BOS template, which encode(add_special_tokens = false) skips) and ByteLevel decoder.
// The merges include two routes to one token ("ab c" and "a bc"), conflicting ranks and right-nested
// merges, so that the order in which merges apply matters.
// Run from this folder: node make_fixture.js > fixture_dsv3.json
'use strict';

function bytesToUnicode() {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  }
  const map = new Array(256);
  bs.forEach((b, i) => { map[b] = String.fromCodePoint(cs[i]); });
  return map;
}

const B2U = bytesToUnicode();
const bl = (s) => Array.from(Buffer.from(s, 'utf8')).map((b) => B2U[b]);

const vocab = {};
let next = 0;
const add = (tok) => { if (!(tok in vocab)) vocab[tok] = next++; return vocab[tok]; };
add('<｜begin▁of▁sentence｜>');
add('<｜end▁of▁sentence｜>');
add('<｜▁pad▁｜>');
for (let b = 0; b < 256; b++) add(B2U[b]);

const merges = [];
const seen = new Set();
const merge = (a, b) => {
  const key = a + ' ' + b;
  if (seen.has(key)) return;
  if (!(a in vocab) || !(b in vocab)) throw new Error(`merge ${key}: part missing`);
  seen.add(key);
  merges.push(key);
  add(a + b);
};
// left-nested chain over the byte-level characters of s: ((c1 c2) c3) ...
const chain = (s) => { const c = bl(s); let acc = c[0]; for (let i = 1; i < c.length; i++) { merge(acc, c[i]); acc += c[i]; } };
// right-nested chain: c1 (c2 (c3 ...))
const rchain = (s) => { const c = bl(s); let acc = c[c.length - 1]; for (let i = c.length - 2; i >= 0; i--) { merge(c[i], acc); acc = c[i] + acc; } };

chain(' t'); chain('th'); chain(' th'); merge(bl(' th').join(''), 'e'); chain('the');
chain('in'); merge('in', 'g'); chain('ng'); merge('i', 'ng'); chain(' a'); chain('nd'); merge(bl(' a').join(''), 'nd'); chain('er'); chain('re'); chain('on'); chain(' o'); merge(bl(' o').join(''), 'f'); chain(' to');
chain('it'); chain("'s"); chain("'t"); chain('is'); chain(' is'); chain('at'); chain(' s'); chain('ed');
chain('ab'); chain('bc'); merge('ab', 'c'); merge('a', 'bc'); // two routes to "abc"
chain('12'); chain('123'); chain('00'); chain('000'); chain('99'); rchain('456');
chain('  '); chain('   '); chain('    '); chain('\n\n'); chain(' \n'); chain('\t\t');
chain(' ('); chain('),'); chain('..'); chain('...'); chain('->'); chain(' =');
chain('你'); chain('好'); merge(bl('你').join(''), bl('好').join('')); chain('线'); chain('性'); rchain('规划');
chain('😀'); chain('é'); chain('ン'); chain('の'); chain('т'); chain('ор');
chain('Hello'); chain(' world'); chain('World');

const added = [
  { id: 0, content: '<｜begin▁of▁sentence｜>', single_word: false, lstrip: false, rstrip: false, normalized: true, special: true },
  { id: 1, content: '<｜end▁of▁sentence｜>', single_word: false, lstrip: false, rstrip: false, normalized: true, special: true },
  { id: 2, content: '<｜▁pad▁｜>', single_word: false, lstrip: false, rstrip: false, normalized: true, special: true },
];
const base = 1000;
[['<｜fim▁hole｜>', true], ['<｜fim▁begin｜>', true], ['<｜fim▁end｜>', true], ['<｜User｜>', false],
 ['<｜Assistant｜>', false], ['<think>', true], ['</think>', true], ['｜DSML｜', false]].forEach(([c, norm], i) => {
  const special = !(c === '<think>' || c === '</think>');
  added.push({ id: base + i, content: c, single_word: false, lstrip: false, rstrip: false, normalized: norm, special });
});
added.push({ id: base + 20, content: '<｜tool▁sep｜>', single_word: false, lstrip: true, rstrip: true, normalized: false, special: true });
for (const a of added) vocab[a.content] = a.id;

const tok = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: added,
  normalizer: { type: 'Sequence', normalizers: [] },
  pre_tokenizer: {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: '\\p{N}{1,3}' }, behavior: 'Isolated', invert: false },
      { type: 'Split', pattern: { Regex: '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+' }, behavior: 'Isolated', invert: false },
      { type: 'Split', pattern: { Regex: "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+" }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: {
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<｜begin▁of▁sentence｜>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<｜begin▁of▁sentence｜>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
      { SpecialToken: { id: '<｜begin▁of▁sentence｜>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<｜begin▁of▁sentence｜>': { id: '<｜begin▁of▁sentence｜>', ids: [0], tokens: ['<｜begin▁of▁sentence｜>'] } },
  },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, vocab, merges,
  },
};
process.stdout.write(JSON.stringify(tok, null, 1) + '\n');
