#!/usr/bin/env bash
# tests/test_plan.sh — `trex plan` from the command line: --layout, --json, the table, --explain,
# --svg, and bad input (unknown cluster field, indivisible device count, a model that fits nowhere).
# Env: TREX = the trex binary. Prints `N passed, N failed`.
# asan: yes
. "$(dirname "$0")/lib.sh"
check() { if eval "$2"; then ok; else bad "$1"; fi; }

flash=configs/deepseek-v4-flash.json
a3=configs/clusters/ascend-910c-a3.json
lay="tp=1,pp=4,vpp=1,ep=32,cp=1,zero=1,recompute=full,swap_optimizer=1,mbs=1"

# one given layout, JSON
"$TREX" plan --model $flash --cluster $a3 --devices 128 --seq 4096 --gbs 128 --layout "$lay" --json \
  >"$tmp/one.json" 2>"$tmp/one.err"
check "--layout --json exits 0" '[ $? -eq 0 ]'
for key in '"layouts"' '"tp":' '"pp":' '"vpp":' '"ep":' '"cp":' '"dp":' '"zero":' '"recompute":' \
           '"mbs":' '"feasible":' '"mem_per_device_gb":' '"step_s":' '"tokens_per_s":' '"mfu":' \
           '"tflops_per_device":'; do
  check "json has $key" "grep -q '$key' '$tmp/one.json'"
done
check "layout kept" "grep -q '\"ep\":[[:space:]]*32' '$tmp/one.json' && grep -q '\"recompute\":[[:space:]]*\"full\"' '$tmp/one.json'"
check "it fits" "grep -q '\"feasible\":[[:space:]]*true' '$tmp/one.json'"
check "one layout" "[ \$(grep -c '\"step_s\"' '$tmp/one.json') -eq 1 ]"

# search: table, --explain, --svg (timeline included)
"$TREX" plan --model $flash --cluster $a3 --devices 128 --seq 4096 --gbs 128 --layout "tp=1,pp=4" \
  --top 3 --explain --svg "$tmp/space.svg" >"$tmp/search.txt" 2>"$tmp/search.err"
check "search exits 0" '[ $? -eq 0 ]'
check "table header" "grep -q 'step s' '$tmp/search.txt' && grep -q 'MFU' '$tmp/search.txt'"
check "explain: time breakdown" "grep -q 'EP all-to-all (exposed)' '$tmp/search.txt' && grep -q 'pipeline bubble' '$tmp/search.txt'"
check "explain: memory items" "grep -q 'optimizer' '$tmp/search.txt' && grep -q 'activations' '$tmp/search.txt'"
check "svg written" "grep -q '<svg' '$tmp/space.svg' && grep -q 'Pipeline timeline' '$tmp/space.svg' && grep -q '</svg>' '$tmp/space.svg'"
xml_ok() { "$PY" -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' "$1"; }
check "svg is well-formed XML" "xml_ok '$tmp/space.svg'"
# the timeline draws the real schedule: DualPipeV with 8 micro-batches on 4 ranks has overlapped F&B
# boxes ("4/0": forward of micro-batch 4 with the backward of 0) and split weight-gradient boxes
"$TREX" plan --model $flash --cluster $a3 --devices 128 --seq 4096 --gbs 256 --explain --svg "$tmp/dpv.svg" \
  --layout "tp=1,pp=4,ep=32,cp=1,zero=1,recompute=full,swap_optimizer=1,mbs=1,schedule=dualpipev" >/dev/null 2>&1
check "dualpipev timeline" "xml_ok '$tmp/dpv.svg' && grep -q 'dualpipev, pp=4, 8 micro-batches' '$tmp/dpv.svg' && grep -q '>4/0<' '$tmp/dpv.svg'"
# many micro-batches: the steady state is cut out and the picture stays small
"$TREX" plan --model configs/hf/qwen3-235b-a22b.json --cluster configs/clusters/h100.json --devices 256 --gbs 2048 \
  --optimizer adamw --explain --svg "$tmp/v1.svg" \
  --layout "tp=2,pp=8,vpp=4,ep=32,cp=1,zero=1,recompute=selective,mbs=1,a2a_overlap=0,schedule=interleaved" >/dev/null 2>&1
check "interleaved timeline cut" "xml_ok '$tmp/v1.svg' && grep -q 'steady state cut' '$tmp/v1.svg' && [ \$(wc -c <'$tmp/v1.svg') -lt 1000000 ]"

# the documented example runs
"$TREX" plan --model $flash --cluster $a3 --devices 128 --seq 4096 --gbs 128 --json --top 2 >"$tmp/ex.json" 2>&1
check "example search exits 0" '[ $? -eq 0 ]'
check "example search has 2 layouts" "[ \$(grep -c '\"step_s\"' '$tmp/ex.json') -eq 2 ]"

# bad input: unknown cluster field
sed 's/"hbm_gib"/"hbm_gb"/' $a3 >"$tmp/bad.json"
"$TREX" plan --model $flash --cluster "$tmp/bad.json" --devices 128 --gbs 128 >/dev/null 2>"$tmp/bad.err"
check "unknown field exits 1" '[ $? -eq 1 ]'
check "unknown field named" "grep -q 'unknown field \"hbm_gb\"' '$tmp/bad.err'"

# bad input: devices not divisible by the layout
"$TREX" plan --model $flash --cluster $a3 --devices 130 --gbs 130 --layout "$lay" >/dev/null 2>"$tmp/div.err"
check "indivisible devices exits 1" '[ $? -eq 1 ]'
check "indivisible devices explained" "grep -q 'not divisible' '$tmp/div.err'"

# bad input: a model that fits no layout
"$TREX" plan --model configs/deepseek-v4-pro.json --cluster $a3 --devices 8 --gbs 8 >/dev/null 2>"$tmp/fit.err"
check "fits nowhere exits 1" '[ $? -eq 1 ]'
check "fits nowhere: smallest and dominant item" "grep -q 'fits no layout' '$tmp/fit.err' && grep -q 'smallest needs' '$tmp/fit.err' && grep -q 'dominated by' '$tmp/fit.err'"

# bad input: unknown layout key, missing option
"$TREX" plan --model $flash --cluster $a3 --devices 128 --gbs 128 --layout "tp=1,tpp=2" >/dev/null 2>"$tmp/key.err"
check "bad layout key exits 2" '[ $? -eq 2 ]'
check "bad layout key named" "grep -q 'tpp' '$tmp/key.err'"
"$TREX" plan --model $flash --devices 128 --gbs 128 >/dev/null 2>&1
check "missing --cluster is a usage error" '[ $? -eq 2 ]'

finish
