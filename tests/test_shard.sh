#!/usr/bin/env bash
# tests/test_shard.sh — `trex data tokenize | shard-info | train-tokenizer` from the command line:
# malformed lines reported by line number and skipped (or stopping the run with --on-error stop),
# SFT samples longer than --seq reported by line and skipped, CPT documents split, the summary,
# shards readable by shard-info, a shard/tokenizer mismatch, no temporary files, refusal to write
# over existing shards, and usage errors.
# Env: TREX = the trex binary. Run from the repository root.
# asan: yes
. "$(dirname "$0")/lib.sh"
FIX=tests/tokenizer/fixture_dsv3.json

long=$(printf 'the %.0s' $(seq 1 80))
cat >"$tmp/sft.jsonl" <<EOF
{"messages": [{"role": "user", "content": "the 123"}, {"role": "assistant", "content": "Hello world"}]}

{"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}
this is not json
{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]}
{"messages": []}
{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "$long"}]}
{"messages": [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "World"}]}
EOF

# --- skip: every bad line is named, the good ones are packed ----------------------------------------
"$TREX" data tokenize --tokenizer $FIX --format sft --seq 64 --in "$tmp/sft.jsonl" --out "$tmp/s1" >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "tokenize sft exit $rc"; cat "$tmp/err"; }
expect_line "$tmp/err" "sft.jsonl:3: messages\[0\]: unknown role \"tool\".*; line skipped" "unknown role, line 3"
expect_line "$tmp/err" "sft.jsonl:4: not valid JSON.*; line skipped" "malformed JSON, line 4"
expect_line "$tmp/err" "sft.jsonl:6: empty sample.*; line skipped" "empty sample, line 6"
expect_line "$tmp/err" "sft.jsonl:7: sample of [0-9]+ tokens is longer than --seq 64; skipped" "too long, line 7"
[ "$(grep -c 'warning' "$tmp/err")" -eq 4 ] && ok || bad "exactly 4 warnings (got $(grep -c warning "$tmp/err"))"
expect_line "$tmp/out" "^trex data tokenize: 7 lines, 3 documents, 4 rejected \(3 malformed, 1 too long\)$" "summary counts"
expect_line "$tmp/out" "sequences of 64, [0-9]+ tokens \([0-9]+ targets\), [0-9]+ padding, fill [0-9.]+%$" "summary tokens"
[ -f "$tmp/s1/manifest.json" ] && [ -f "$tmp/s1/shard-00000.bin" ] && ok || bad "manifest and shard written"
[ -z "$(ls "$tmp/s1" | grep -v -e '^manifest.json$' -e '^shard-[0-9]*\.bin$')" ] && ok || bad "stray files: $(ls "$tmp/s1")"
"$TREX" data shard-info "$tmp/s1" --tokenizer $FIX --dump 1 >"$tmp/info" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "shard-info exit $rc"; cat "$tmp/err"; }
expect_line "$tmp/info" "s1: sft, [0-9]+ sequences of 64, 3 documents, [0-9]+ tokens, 1 shard files$" "shard-info header"
expect_line "$tmp/info" "matches --tokenizer" "shard-info tokenizer check"
expect_line "$tmp/info" "^seq 0 tokens: 0 1003 " "sequence 0 starts with BOS <｜User｜>"
# the three samples (10, 10 and 7 tokens) share sequence 0, then the padding is document 3
expect_line "$tmp/info" "^seq 0 docs:  ( 0){10}( 1){10}( 2){7}( 3){37}$" "three samples and the padding in sequence 0"
expect_line "$tmp/info" "^seq 0 mask:  ( 0){7}( 1){3}( 0){6}( 1){4}( 0){5}( 1){2}( 0){37}$" "targets: the assistant turns"
# the quiet flag keeps the summary but drops the warnings
"$TREX" data tokenize --tokenizer $FIX --format sft --seq 64 --in "$tmp/sft.jsonl" --out "$tmp/s1q" --quiet >"$tmp/out" 2>"$tmp/err"
! grep -q warning "$tmp/err" && ok || bad "--quiet prints no warnings"
expect_line "$tmp/out" "4 rejected" "--quiet still counts"

# --- stop: the first malformed line ends the run, nothing is left --------------------------------------
"$TREX" data tokenize --tokenizer $FIX --format sft --seq 64 --in "$tmp/sft.jsonl" --out "$tmp/s2" --on-error stop >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "--on-error stop: exit $rc, want 1"
expect_line "$tmp/err" "^trex: error: tokenize: .*sft.jsonl:3: messages\[0\]: unknown role \"tool\".*--on-error stop" "stop names line 3"
[ ! -e "$tmp/s2/manifest.json" ] && [ -z "$(ls "$tmp/s2" 2>/dev/null)" ] && ok || bad "a stopped run leaves no files: $(ls "$tmp/s2")"

# --- CPT: long documents are split, short ones are not ------------------------------------------------
{
  echo '{"text": "Hello world"}'
  printf '{"text": "%s"}\n' "$long"
  echo '{"text": ""}'
  echo '{"text": "the end"}'
} >"$tmp/cpt.jsonl"
"$TREX" data tokenize --tokenizer $FIX --format cpt --seq 32 --in "$tmp/cpt.jsonl" --out "$tmp/c1" --shard-seqs 2 >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "tokenize cpt exit $rc"; cat "$tmp/err"; }
expect_line "$tmp/err" "cpt.jsonl:3: empty document" "empty CPT text, line 3"
expect_line "$tmp/out" "4 lines, 3 documents, 1 rejected \(1 malformed, 0 too long\)" "cpt summary"
expect_line "$tmp/out" "1 documents split across sequences, [2-9] shard files" "cpt split and shard count"
"$TREX" data shard-info "$tmp/c1" --dump 1 >"$tmp/info" 2>&1 && ok || bad "shard-info cpt"
# sequence 0: "Hello world" (2 tokens + EOS = 3), then the long document fills the rest: docs 0 0 0 1 1 ...
expect_line "$tmp/info" "^seq 0 docs:   0 0 0( 1){29}$" "CPT: the long document starts right after the first"
expect_line "$tmp/info" "^seq 0 mask:  ( 1){32}$" "CPT: every token is a target"

# --- the wrong tokenizer, an existing output folder, bad flags ------------------------------------------
"$TREX" data train-tokenizer --vocab 400 --in tests/tokenizer/corpus.jsonl --out "$tmp/other.json" --quiet 2>/dev/null
"$TREX" data shard-info "$tmp/s1" --tokenizer "$tmp/other.json" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "shard-info with another tokenizer: exit $rc"
expect_line "$tmp/err" "was tokenized with tokenizer fnv1a64:[0-9a-f]{16}, but the tokenizer given is fnv1a64:[0-9a-f]{16}" "mismatch message"
"$TREX" data tokenize --tokenizer $FIX --format sft --seq 64 --in "$tmp/sft.jsonl" --out "$tmp/s1" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "tokenize into a folder with shards: exit $rc"
expect_line "$tmp/err" "already holds token shards" "existing shards message"
"$TREX" data tokenize --tokenizer $FIX --format chat --seq 64 --in "$tmp/sft.jsonl" --out "$tmp/x" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "--format chat: exit $rc"
expect_line "$tmp/err" "--format must be cpt or sft" "bad --format message"
"$TREX" data tokenize --tokenizer $FIX --format sft --in "$tmp/sft.jsonl" --out "$tmp/x" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && ok || bad "missing --seq: exit $rc, want 2"
"$TREX" data tokenize --tokenizer $FIX --format sft --seq 64 --in "$tmp/sft.jsonl" --out "$tmp/x" --on-error maybe >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "--on-error maybe: exit $rc"
"$TREX" data tokenize --tokenizer "$tmp/missing.json" --format sft --seq 64 --in "$tmp/sft.jsonl" --out "$tmp/x" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "missing tokenizer: exit $rc"
expect_line "$tmp/err" "missing.json: cannot open" "missing tokenizer message"
"$TREX" data shard-info "$tmp" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "shard-info on a folder without manifest: exit $rc"
expect_line "$tmp/err" "has no manifest.json" "no manifest message"
"$TREX" data --help >"$tmp/help" 2>&1
for s in train-tokenizer tokenize encode decode shard-info; do expect_line "$tmp/help" "^  $s " "data --help lists $s"; done
"$TREX" data train-tokenizer --vocab 100 --in tests/tokenizer/corpus.jsonl --out "$tmp/t.json" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "train-tokenizer --vocab 100: exit $rc"
expect_line "$tmp/err" "must be at least 274" "vocab too small message"
printf '{"text": "ok"}\n{"txt": 1}\n' >"$tmp/badcorpus.jsonl"
"$TREX" data train-tokenizer --vocab 300 --in "$tmp/badcorpus.jsonl" --out "$tmp/t.json" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "train-tokenizer on a bad corpus: exit $rc"
expect_line "$tmp/err" "badcorpus.jsonl:2: expected" "train-tokenizer names the bad line"
[ ! -e "$tmp/t.json" ] && ok || bad "no tokenizer written after an error"

finish
