#!/usr/bin/env bash
# tests/test_model_cli.sh — `trex model info | init` and the dispatcher: parameter counts of V4-Flash and
# V4-Pro as MODEL_SPEC §1.3 prints them, init output and determinism, error exits.
# Env: TREX = the trex binary, BUILD = build dir. Run from the repository root.
# asan: yes
. "$(dirname "$0")/lib.sh"

# --- dispatcher -----------------------------------------------------------------------------------
"$TREX" model --help >"$tmp/help" 2>&1; rc=$?
[ $rc -eq 0 ] && ok || bad "model --help exit $rc"
for s in info init run; do expect_line "$tmp/help" "^  $s " "model --help lists $s"; done
"$TREX" model >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && ok || bad "model without a subcommand: exit $rc, want 2"
"$TREX" model frobnicate >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && ok || bad "unknown subcommand: exit $rc, want 2"
expect_line "$tmp/err" "unknown subcommand 'model frobnicate'" "unknown subcommand message"
"$TREX" model info --help >"$tmp/h" 2>&1; rc=$?
[ $rc -eq 0 ] && ok || bad "model info --help exit $rc"
expect_line "$tmp/h" "--config FILE" "info --help lists --config"
"$TREX" model info >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && ok || bad "info without --config: exit $rc, want 2"
expect_line "$tmp/err" "missing required option --config" "info without --config message"

# --- info: V4-Flash -------------------------------------------------------------------------------
"$TREX" model info --config configs/deepseek-v4-flash.json >"$tmp/flash" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "info flash exit $rc"; cat "$tmp/err"; }
expect_line "$tmp/flash" "^  total \(main model, no MTP\) +284\.33B +284332240471$" "flash total"
expect_line "$tmp/flash" "^  active per token +13\.27B +13270101591$" "flash active"
expect_line "$tmp/flash" "^  MTP block \(embed/head shared\) +6\.61B " "flash MTP"
expect_line "$tmp/flash" "^  total incl\. MTP +290\.94B " "flash total with MTP"
expect_line "$tmp/flash" "^  active incl\. embedding +13\.80B " "flash active with embedding"
expect_line "$tmp/flash" "^  routed experts +277\.03B " "flash routed experts"
expect_line "$tmp/flash" "^  attention +5\.09B " "flash attention"
expect_line "$tmp/flash" "^  shared experts +1\.08B " "flash shared experts"
expect_line "$tmp/flash" "^  embedding +529\.53M " "flash embedding"
expect_line "$tmp/flash" "^  router gates +45\.10M " "flash gates"
expect_line "$tmp/flash" "^  mHC +33\.88M " "flash mHC"
expect_line "$tmp/flash" "^  SWA \(ratio 0\) x 2 +106\.96M +106956352$" "flash SWA layer"
expect_line "$tmp/flash" "^  CSA \(ratio 4\) x 21 +126\.10M +126098624$" "flash CSA layer"
expect_line "$tmp/flash" "^  HCA \(ratio 128\) x 20 +111\.22M +111216704$" "flash HCA layer"
expect_line "$tmp/flash" "^  fp32 weights +[0-9]+\.[0-9]+ GiB$" "flash memory"

"$TREX" model info --config configs/deepseek-v4-flash.json --json >"$tmp/flash.json" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "info --json exit $rc"; cat "$tmp/err"; }
expect_line "$tmp/flash.json" '"total":[[:space:]]*284332240471,' "flash json total"
expect_line "$tmp/flash.json" '"active":[[:space:]]*13270101591,' "flash json active"
expect_line "$tmp/flash.json" '"routed_experts":[[:space:]]*277025390592,' "flash json routed"
if [ -x "$PY" ]; then
  if "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["attention_per_layer"][1]["params"] == 126098624 else 1)' "$tmp/flash.json"; then ok; else bad "flash json does not parse or lacks the CSA count"; fi
fi

# --- info: V4-Pro ---------------------------------------------------------------------------------
"$TREX" model info --config configs/deepseek-v4-pro.json >"$tmp/pro" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "info pro exit $rc"; cat "$tmp/err"; }
expect_line "$tmp/pro" "^  total \(main model, no MTP\) +1573\.00B +1572997201763$" "pro total"
expect_line "$tmp/pro" "^  active per token +48\.85B +48852402019$" "pro active"
expect_line "$tmp/pro" "^  MTP block \(embed/head shared\) +25\.84B " "pro MTP"
expect_line "$tmp/pro" "^  routed experts +1547\.40B " "pro routed"
expect_line "$tmp/pro" "^  attention +19\.47B " "pro attention"
expect_line "$tmp/pro" "^  CSA \(ratio 4\) x 30 +331\.29M " "pro CSA layer"
expect_line "$tmp/pro" "^  HCA \(ratio 128\) x 31 +307\.30M " "pro HCA layer"
expect_line "$tmp/pro" "^  MTP block +299\.89M " "pro MTP (SWA) attention"

# --- info: the bench model (MODEL_SPEC §11.2: 826.8M, 874.0M with MTP, 354.7M active) ------------------
"$TREX" model info --config configs/dsv4-bench.json >"$tmp/bench" 2>&1 || bad "info bench"
expect_line "$tmp/bench" "^  total \(main model, no MTP\) +826\.80M " "bench total"
expect_line "$tmp/bench" "^  total incl\. MTP +873\.97M " "bench total with MTP"
expect_line "$tmp/bench" "^  active per token +354\.68M " "bench active"

# --- init -----------------------------------------------------------------------------------------
"$TREX" model init --config configs/dsv4-tiny.json --seed 5 --out "$tmp/a.safetensors" >"$tmp/init" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "init exit $rc"; cat "$tmp/err"; }
expect_line "$tmp/init" "^wrote $tmp/a\.safetensors: 367 tensors, .*config dsv4-tiny, seed 5$" "init summary"
[ -s "$tmp/a.safetensors" ] && ok || bad "init wrote nothing"
ls "$tmp" | grep -q '\.tmp\.' && bad "temporary file left behind" || ok
"$TREX" model init --config configs/dsv4-tiny.json --seed 5 --out "$tmp/b.safetensors" >/dev/null 2>&1 || bad "init again"
cmp -s "$tmp/a.safetensors" "$tmp/b.safetensors" && ok || bad "same seed gave different files"
"$TREX" model init --config configs/dsv4-tiny.json --seed 6 --out "$tmp/c.safetensors" >/dev/null 2>&1 || bad "init seed 6"
cmp -s "$tmp/a.safetensors" "$tmp/c.safetensors" && bad "another seed gave the same file" || ok
if [ -x "$PY" ]; then
  if "$PY" - "$tmp/a.safetensors" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
h.pop("__metadata__", None)
assert len(h) == 367, len(h)
assert h["layers.0.ffn.gate.tid2eid"]["dtype"] == "I64" and h["layers.0.ffn.gate.tid2eid"]["shape"] == [4096, 2]
ape = h["layers.1.attn.indexer.compressor.ape"]
assert ape["dtype"] == "F32" and ape["shape"] == [4, 256], ape
assert "mtp.0.ffn.gate.bias" in h and "mtp.0.attn.compressor.ape" not in h
assert all(v["dtype"] == "F32" for k, v in h.items() if not k.endswith("tid2eid"))
EOF
  then ok; else bad "init file header"; fi
fi

# --- errors ---------------------------------------------------------------------------------------
"$TREX" model info --config tests/data/configs/bad-unknown-field.json >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "bad config: exit $rc, want 1"
expect_line "$tmp/err" "^trex: error: tests/data/configs/bad-unknown-field\.json: unknown field 'hiden_size'" "bad config message"
"$TREX" model init --config tests/data/configs/bad-groups.json --out "$tmp/x.safetensors" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "init bad config: exit $rc, want 1"
expect_line "$tmp/err" "bad-groups\.json: .*'o_groups'" "init bad config message"
[ -e "$tmp/x.safetensors" ] && bad "init wrote a file for a bad config" || ok
"$TREX" model info --config "$tmp/nothing.json" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "missing config: exit $rc, want 1"
expect_line "$tmp/err" "nothing\.json" "missing config message names the file"
"$TREX" model init --config configs/dsv4-tiny.json --out "$tmp/no/such/dir/w.safetensors" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && ok || bad "unwritable output: exit $rc, want 1"
expect_line "$tmp/err" "^trex: error: .*w\.safetensors" "unwritable output message"
"$TREX" model init --config configs/dsv4-tiny.json --seed -1 --out "$tmp/w.safetensors" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ] && ok || bad "negative seed accepted"

finish
