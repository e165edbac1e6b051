#!/usr/bin/env node
// tests/tokenizer/oracle.js — the Hugging Face tokenizers library (Rust, through the
// @anush008/tokenizers native build) as the oracle for trex's tokenizer parity test.
//
//   node oracle.js encode TOKENIZER.json TEXTS.jsonl   one line per {"text": ...}: the ids, space-separated
//                                                      (encode(text, add_special_tokens = false))
//   node oracle.js decode TOKENIZER.json IDS.txt       one JSON string per line of ids (skip_special_tokens = false)
//   node oracle.js gen SEED N                          N random texts ({"text": ...}) mixing the character
//                                                      classes the pre-tokenizer treats differently
//   node oracle.js info TOKENIZER.json                 vocabulary size (with added tokens)
//   node oracle.js cmptext WANT DECODED.txt            compares each line of WANT ({"text": ...} or a JSON
//                                                      string) with the JSON string on the same line of
//                                                      DECODED; prints the differing lines, exit 1 if any
'use strict';
const fs = require('fs');
const path = require('path');

function load(file) {
  const { Tokenizer } = require(path.join(__dirname, 'node_modules', '@anush008', 'tokenizers'));
  return Tokenizer.fromFile(file);
}

function readLines(file) {
  const s = fs.readFileSync(file, 'utf8');
  const lines = s.split('\n');
  if (lines.length && lines[lines.length - 1] === '') lines.pop();
  return lines;
}

// A small deterministic PRNG (xorshift32) so that `gen` gives the same texts everywhere.
function rng(seed) {
  let x = (seed >>> 0) || 1;
  return () => {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    return x / 4294967296;
  };
}

const POOLS = [
  'abcdefghijklmnopqrstuvwxyz', 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', '0123456789', '0123456789',
  ' ', ' ', ' ', '\t', '\n', '\r\n', '\r', '  ', '\u00a0', '\u3000', '\u2028', '\u0085', '\u180e', '\u200b', '\u000b',
  '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~', "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S",
  '线性规划最优解目标函数约束条件中文字符测试', 'ひらがなのテキスト', 'カタカナノテキスト', '한국어텍스트', 'кириллица', 'العربية',
  'éàüñçøåßœ', '\u0301\u0308', '½¾²³ⅫⅣ١٢٣٤', '∑∫√≈≠≤≥∞±×÷', '€£¥₹', '“”‘’«»—–…', '。，、！？：；（）【】',
  '😀', '👍🏽', '👨‍👩‍👧', '🇫🇷', '❤️', '🚀', '✨', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', '𠀀𠀁',
  '<｜User｜>', '<｜Assistant｜>', '<think>', '</think>', '<｜end▁of▁sentence｜>', '<｜begin▁of▁sentence｜>', '｜DSML｜',
  '<thinking>', '<｜User', 'User｜>', '<｜fim▁hole｜>', '<｜tool▁sep｜>', ' <｜tool▁sep｜> ', 'abc', 'the', 'ing',
];

function gen(seed, n) {
  const r = rng(seed);
  const out = [];
  for (let i = 0; i < n; i++) {
    const parts = i % 250 === 249 ? 600 : 1 + Math.floor(r() * 24); // a few long texts too
    let s = '';
    for (let k = 0; k < parts; k++) {
      const pool = POOLS[Math.floor(r() * POOLS.length)];
      const chars = Array.from(pool);
      if (r() < 0.5 || chars.length < 4) {
        s += pool;
      } else {
        const len = 1 + Math.floor(r() * 8);
        for (let j = 0; j < len; j++) s += chars[Math.floor(r() * chars.length)];
      }
    }
    out.push(JSON.stringify({ text: s }));
  }
  return out.join('\n') + '\n';
}

async function main() {
  const [cmd, a, b] = process.argv.slice(2);
  if (cmd === 'encode') {
    const tok = load(a);
    const out = [];
    for (const line of readLines(b)) {
      const text = JSON.parse(line).text;
      const enc = await tok.encode(text, null, { addSpecialTokens: false });
      out.push(enc.getIds().join(' '));
    }
    process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
  } else if (cmd === 'decode') {
    const tok = load(a);
    const out = [];
    for (const line of readLines(b)) {
      const ids = line.trim() === '' ? [] : line.trim().split(/\s+/).map(Number);
      out.push(JSON.stringify(await tok.decode(ids, false)));
    }
    process.stdout.write(out.join('\n') + (out.length ? '\n' : ''));
  } else if (cmd === 'gen') {
    process.stdout.write(gen(Number(a), Number(b)));
  } else if (cmd === 'cmptext') {
    const want = readLines(a).map((l) => { const v = JSON.parse(l); return typeof v === 'string' ? v : v.text; });
    const got = readLines(b).map((l) => JSON.parse(l));
    let bad = 0;
    for (let i = 0; i < Math.max(want.length, got.length); i++) {
      if (want[i] !== got[i]) {
        if (bad < 5) console.log(`line ${i + 1}: want ${JSON.stringify(want[i])}, got ${JSON.stringify(got[i])}`);
        bad++;
      }
    }
    console.log(`${bad} of ${Math.max(want.length, got.length)} lines differ`);
    process.exit(bad ? 1 : 0);
  } else if (cmd === 'info') {
    const tok = load(a);
    console.log(`vocab ${tok.getVocabSize(true)}`);
  } else {
    console.error('usage: oracle.js encode|decode TOKENIZER FILE | gen SEED N | info TOKENIZER');
    process.exit(2);
  }
}

main().catch((e) => { console.error(`oracle.js: ${e && e.stack ? e.stack : e}`); process.exit(1); });
