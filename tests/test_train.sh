#!/usr/bin/env bash
# tests/test_train.sh — `trex train` and `trex generate` from the command line, on a small DeepSeek-V4
# config (every feature of dsv4-tiny: SWA/CSA/HCA, indexer, hash + biased MoE, mHC, MTP; smaller
# widths) and the demo corpus:
#   - a run writes settings.json, config.json, tokenizer.json, metrics.jsonl, expert_load.jsonl, step-N;
#   - bitwise resume: a run killed by SIGKILL (fault hook after step 3, and an external kill -9) and
#     resumed has the same loss sequence (%.17g text) and the same final weights as an uninterrupted run,
#     also with another thread count;
#   - gradient accumulation: gbs 4 as 4x1, 2x2 and 1x4 micro-batches gives the same losses and the same
#     gradient norm (SFT micro-batches with different target counts);
#   - NaN/Inf: a poisoned gradient skips the step (logged, counted); K in a row stop the run with a
#     message naming the intact checkpoint, which then resumes;
#   - bad input: seq mismatch, shards of another tokenizer, a corrupt or truncated checkpoint, resume
#     with another config or gbs, an existing run directory, bad flags — each a clear error, nothing lost;
#   - --recompute full, attention, moe, full-keep-core and attention-keep-core give the bf16 run's losses,
#     expert loads and weights bit for bit;
#     so does --weight-copies false (the experts' and attention's products then round the fp32 weights per call);
#   - --precision bf16: the loss falls, the run records bf16 (settings.json, trainer.json), a killed bf16 run
#     resumes bit for bit (with another thread count); a bad value and a precision change on resume fail;
#   - --run-file with a flag overriding it; generate: greedy is reproducible, sampling follows the seed.
# Env: TREX = the trex binary. Run from the repository root.
. "$(dirname "$0")/lib.sh"
export TREX_THREADS=2

# losses FILE: "step loss loss_main loss_mtp grad_norm" per line, the numbers as written (%.17g)
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]*),"loss_main":([^,]*),"loss_mtp":([^,]*),.*"grad_norm":([^,]*),.*/\1 \2 \3 \4 \5/' "$1"; }
# tensor data of a safetensors file (header skipped), as a SHA-256
body_sha() { "$PY" -c 'import hashlib,struct,sys
b=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",b[:8])[0]; print(hashlib.sha256(b[8+n:]).hexdigest())' "$1"; }

# --- data: tokenizer, shards, a small config ---------------------------------------------------------
cat data/demo/cpt.jsonl data/demo/sft.jsonl >"$tmp/all.jsonl"
"$TREX" data train-tokenizer --vocab 4096 --in "$tmp/all.jsonl" --out "$tmp/tok.json" --quiet || bad "train-tokenizer"
head -48 data/demo/sft.jsonl >"$tmp/sft.jsonl"
sed -n '49,64p' data/demo/sft.jsonl >"$tmp/heldout.jsonl"
"$TREX" data tokenize --tokenizer "$tmp/tok.json" --format sft --seq 64 --in "$tmp/sft.jsonl" --out "$tmp/sh" --quiet >/dev/null 2>&1 || bad "tokenize"
"$TREX" data tokenize --tokenizer "$tmp/tok.json" --format sft --seq 64 --in "$tmp/heldout.jsonl" --out "$tmp/ev" --quiet >/dev/null 2>&1 || bad "tokenize held-out"
V=$("$PY" -c 'import json,sys; t=json.load(open(sys.argv[1])); print(1+max(list(t["model"]["vocab"].values())+[a["id"] for a in t["added_tokens"]]))' "$tmp/tok.json")
"$PY" - "$tmp" "$V" <<'PY'
import json, sys
d, V = sys.argv[1], int(sys.argv[2])
c = json.load(open("configs/dsv4-tiny.json"))
c.update(vocab_size=V, hidden_size=64, num_hidden_layers=4, num_attention_heads=2, head_dim=64, qk_rope_head_dim=32,
         q_lora_rank=32, o_groups=2, o_lora_rank=32, sliding_window=16, compress_ratios=[0, 4, 16, 4, 0],
         index_n_heads=2, index_head_dim=64, index_topk=4, n_routed_experts=4, num_experts_per_tok=2,
         moe_intermediate_size=64, num_hash_layers=1)
json.dump(c, open(d + "/small.json", "w"), indent=1)
c["rope_theta"] = 20000
json.dump(c, open(d + "/other.json", "w"), indent=1)
PY
common=(--config "$tmp/small.json" --data "$tmp/sh" --tokenizer "$tmp/tok.json" --steps 6 --gbs 4 --mbs 2
        --lr 2e-3 --warmup 1 --save-every 2 --keep 5 --expert-load-every 2 --peak-tflops 0.02)

# --- an uninterrupted run --------------------------------------------------------------------------------
"$TREX" train "${common[@]}" --out "$tmp/A" --eval-data "$tmp/ev" --eval-every 3 >"$tmp/outA" 2>"$tmp/errA"; rc=$?
[ $rc -eq 0 ] && ok || { bad "run A exit $rc"; cat "$tmp/errA"; }
for f in settings.json config.json tokenizer.json metrics.jsonl expert_load.jsonl step-2 step-4 step-6 latest; do
  [ -e "$tmp/A/$f" ] && ok || bad "run A wrote $f"
done
[ "$(wc -l <"$tmp/A/metrics.jsonl")" -eq 6 ] && ok || bad "6 metrics lines"
expect_line "$tmp/outA" "^trex train: settings$" "settings printed"
expect_line "$tmp/outA" "steps=6 seq=64 gbs=4 mbs=2" "effective settings printed"
expect_line "$tmp/outA" "^step 6/6  loss [0-9.]+  mtp [0-9.]+  lr [0-9.e+-]+  gnorm [0-9.]+  [0-9]+ tok/s  MFU [0-9.]+%  mem [0-9]+ MiB  ETA" "progress line"
expect_line "$tmp/outA" "^trex train: step 3 eval loss [0-9.]+ \(mtp [0-9.]+\) over [0-9]+ targets" "evaluation at step 3"
"$PY" - "$tmp/A" <<'PY' && ok || bad "metrics.jsonl fields"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
need = ["step", "loss", "loss_main", "loss_mtp", "loss_balance", "loss_indexer", "lr", "grad_norm", "tokens_per_s",
        "mfu", "skipped", "peak_rss_mib"]
assert all(all(k in r for k in need) for r in rows), "missing field"
assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
assert "eval_loss" in rows[2] and "eval_loss" in rows[5] and "eval_loss" not in rows[0]
assert rows[-1]["loss_main"] < rows[0]["loss_main"], "the loss falls"
assert rows[0]["mtp_weight"] == 0.3 and rows[-1]["mtp_weight"] == 0.1, "MTP weight 0.3 then 0.1 after the warmup"
assert all(0 < r["mfu"] for r in rows)
loads = [json.loads(l) for l in open(sys.argv[1] + "/expert_load.jsonl")]
assert [l["step"] for l in loads] == [2, 4, 6] and len(loads[0]["blocks"]) == 5
# every token goes to 2 experts: 4 x 64 tokens per step in main layers, 4 x 63 positions in the MTP block
assert all(sum(b["load"]) == 512 for b in loads[0]["blocks"][:4]) and sum(loads[0]["blocks"][4]["load"]) == 504
assert loads[0]["blocks"][0]["hash"] and not loads[0]["blocks"][1]["hash"]
s = json.load(open(sys.argv[1] + "/settings.json"))
assert s["seq"] == 64 and s["gbs"] == 4 and s["optimizer"] == "adamw"
PY

"$PY" - "$tmp/A/step-6/model.safetensors" <<'PY' && ok || bad "aux-loss-free bias update: non-hash gate biases move by 1e-3 steps"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
def t(name):
    e = h[name]; lo, hi = e["data_offsets"]
    return struct.unpack(f"<{(hi - lo) // 4}f", b[8 + n + lo:8 + n + hi])
for name in ("layers.1.ffn.gate.bias", "layers.3.ffn.gate.bias", "mtp.0.ffn.gate.bias"):
    v = t(name)
    assert any(x != 0 for x in v), name
    assert all(abs(x) <= 6e-3 + 1e-9 and abs(round(x / 1e-3) * 1e-3 - x) < 1e-6 for x in v), (name, v)
assert "layers.0.ffn.gate.bias" not in h or all(x == 0 for x in t("layers.0.ffn.gate.bias"))
PY

# --- bitwise resume after SIGKILL (fault hook: right after step 3, checkpoint step-2 exists) -------------
TREX_FAULT_KILL_AFTER_STEP=3 "$TREX" train "${common[@]}" --out "$tmp/B" --eval-data "$tmp/ev" --eval-every 3 >"$tmp/outB" 2>"$tmp/errB"; rc=$?
[ $rc -eq 137 ] && ok || bad "killed run exits 137 (SIGKILL), got $rc"
[ -d "$tmp/B/step-2" ] && [ ! -d "$tmp/B/step-4" ] && ok || bad "killed after step 3: step-2 only"
[ "$(wc -l <"$tmp/B/metrics.jsonl")" -eq 3 ] && ok || bad "3 metrics lines before the kill"
TREX_THREADS=1 "$TREX" train --resume "$tmp/B" >"$tmp/outB2" 2>"$tmp/errB2"; rc=$?
[ $rc -eq 0 ] && ok || { bad "resume B exit $rc"; cat "$tmp/errB2"; }
expect_line "$tmp/outB2" "resuming .*/B at step 2 of 6" "resume message"
if [ "$(losses "$tmp/A/metrics.jsonl")" = "$(losses "$tmp/B/metrics.jsonl")" ]; then ok; else
  bad "resumed losses differ from the uninterrupted run"; diff <(losses "$tmp/A/metrics.jsonl") <(losses "$tmp/B/metrics.jsonl"); fi
[ "$(grep -c eval_loss "$tmp/B/metrics.jsonl")" -eq 2 ] && ok || bad "evaluations of the resumed run"
[ "$(body_sha "$tmp/A/step-6/model.safetensors")" = "$(body_sha "$tmp/B/step-6/model.safetensors")" ] && ok || bad "final weights bitwise equal"
[ "$(body_sha "$tmp/A/step-6/optim.safetensors")" = "$(body_sha "$tmp/B/step-6/optim.safetensors")" ] && ok || bad "final optimizer state bitwise equal"
cmp -s "$tmp/A/expert_load.jsonl" "$tmp/B/expert_load.jsonl" && ok || bad "expert loads equal after resume"

# --- an external kill -9 once a checkpoint exists (wherever it lands), then resume -------------------------
"$TREX" train "${common[@]}" --steps 10 --out "$tmp/C" >"$tmp/outC" 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -d "$tmp/C/step-2" ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
"$TREX" train "${common[@]}" --steps 10 --out "$tmp/D" >/dev/null 2>&1 || bad "run D"
if [ -d "$tmp/C/step-10" ]; then echo "note: the external kill came after the run finished"; ok; else
  "$TREX" train --resume "$tmp/C" >"$tmp/outC2" 2>&1 && ok || { bad "resume C"; cat "$tmp/outC2"; }
fi
[ "$(losses "$tmp/C/metrics.jsonl")" = "$(losses "$tmp/D/metrics.jsonl")" ] && ok || bad "external kill: losses differ after resume"

# --- gradient accumulation: the same global batch in 4x1, 2x2, 1x4 ---------------------------------------
for m in 1 2 4; do
  "$TREX" train --config "$tmp/small.json" --data "$tmp/sh" --tokenizer "$tmp/tok.json" --steps 1 --gbs 4 --mbs $m \
    --data-order sequential --indexer-weight 0 --out "$tmp/G$m" >/dev/null 2>&1 || bad "accumulation run mbs $m"
done
"$PY" - "$tmp" <<'PY' && ok || bad "accumulated losses and gradient norms agree"
import json, sys
r = {m: json.loads(open(f"{sys.argv[1]}/G{m}/metrics.jsonl").readline()) for m in (1, 2, 4)}
for m in (1, 2):
    for k in ("loss_main", "loss_mtp", "loss_balance"):
        a, b = r[m][k], r[4][k]
        assert abs(a - b) <= 1e-9 * abs(b), (m, k, a, b)
    a, b = r[m]["grad_norm"], r[4]["grad_norm"]
    assert abs(a - b) <= 1e-5 * b, (m, "grad_norm", a, b)
assert r[1]["targets"] == r[4]["targets"]
PY
# ... and in bf16, where the first micro-batch's head and expert products write the gradients instead of
# adding to the zeros (trex_model_opts.grads_zero): the later micro-batches must still add
for m in 1 4; do
  "$TREX" train --config "$tmp/small.json" --data "$tmp/sh" --tokenizer "$tmp/tok.json" --steps 1 --gbs 4 --mbs $m \
    --data-order sequential --indexer-weight 0 --precision bf16 --out "$tmp/H$m" >/dev/null 2>&1 ||
    bad "bf16 accumulation run mbs $m"
done
"$PY" - "$tmp" <<'PY' && ok || bad "bf16: accumulated losses and gradient norms agree"
import json, sys
r = {m: json.loads(open(f"{sys.argv[1]}/H{m}/metrics.jsonl").readline()) for m in (1, 4)}
for k in ("loss_main", "loss_mtp"):
    a, b = r[1][k], r[4][k]
    assert abs(a - b) <= 1e-6 * abs(b), (k, a, b)
a, b = r[1]["grad_norm"], r[4]["grad_norm"]
# 5e-4 apart (bf16 rounds each split's products differently); a later micro-batch that wrote instead of
# adding: 8%
assert abs(a - b) <= 5e-3 * b, ("grad_norm", a, b)
PY

# --- indexer warm-up: dense attention, everything but the indexer frozen ----------------------------------
"$TREX" model init --config "$tmp/small.json" --seed 3 --out "$tmp/w0.safetensors" >/dev/null 2>&1 || bad "model init"
"$TREX" train --config "$tmp/small.json" --data "$tmp/sh" --tokenizer "$tmp/tok.json" --init "$tmp/w0.safetensors" \
  --steps 3 --gbs 2 --mbs 2 --lr 1e-3 --indexer-warmup 2 --save-every 1 --out "$tmp/W" >"$tmp/outW" 2>&1 || { bad "warm-up run"; cat "$tmp/outW"; }
expect_line "$tmp/outW" "^step 1/3 .*\[indexer warm-up\]$" "warm-up shown on the progress line"
"$PY" - "$tmp" <<'PY' && ok || bad "warm-up: only the indexer moves, dense then sparse"
import json, struct, sys
d = sys.argv[1]
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
w0, w2, w3 = load(d + "/w0.safetensors"), load(d + "/W/step-2/model.safetensors"), load(d + "/W/step-3/model.safetensors")
moved = [k for k in w0 if w0[k] != w2[k]]
assert moved and all(".attn.indexer." in k for k in moved), moved
assert any(".attn.indexer." in k for k in moved)
assert w3["embed.weight"] != w2["embed.weight"] and w3["layers.1.ffn.gate.bias"] != w2["layers.1.ffn.gate.bias"]
rows = [json.loads(l) for l in open(d + "/W/metrics.jsonl")]
assert [r["indexer_warmup"] for r in rows] == [True, True, False]
assert [r["attention"] for r in rows] == ["dense", "dense", "sparse"]
PY

# --- Muon runs (two steps on the small config), Newton-Schulz in bf16 (default) and fp32 -------------------
"$TREX" train "${common[@]}" --steps 2 --save-every 0 --optimizer muon --lr 2e-3 --out "$tmp/M" >"$tmp/outM" 2>&1 && ok || { bad "muon run"; cat "$tmp/outM"; }
"$PY" -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; assert len(r)==2 and r[1]["loss_main"]<r[0]["loss_main"]+1' "$tmp/M/metrics.jsonl" && ok || bad "muon metrics"
expect_line "$tmp/outM" "muon_ns=bf16" "Newton-Schulz in bf16 by default"
"$TREX" train "${common[@]}" --steps 2 --save-every 0 --optimizer muon --muon-ns fp32 --lr 2e-3 --out "$tmp/M32" >"$tmp/outM32" 2>&1 && ok || { bad "muon fp32 run"; cat "$tmp/outM32"; }
expect_line "$tmp/outM32" "muon_ns=fp32" "--muon-ns fp32 in the effective settings"
"$PY" - "$tmp" <<'PY' && ok || bad "muon: bf16 and fp32 Newton-Schulz differ after step 1, start equal"
import json, sys
d = sys.argv[1]
a = [json.loads(l) for l in open(d + "/M/metrics.jsonl")]
b = [json.loads(l) for l in open(d + "/M32/metrics.jsonl")]
assert a[0]["loss_main"] == b[0]["loss_main"], "step 1 runs before any update"
assert a[1]["loss_main"] != b[1]["loss_main"], "the updates differ"
assert abs(a[1]["loss_main"] - b[1]["loss_main"]) < 0.05 * b[1]["loss_main"], "but stay close"
PY

# --- NaN/Inf: one skipped step, then K in a row stop the run ---------------------------------------------
TREX_FAULT_NAN_STEPS=3 "$TREX" train "${common[@]}" --out "$tmp/N1" >"$tmp/outN" 2>"$tmp/errN"; rc=$?
[ $rc -eq 0 ] && ok || bad "one NaN step: run completes (exit $rc)"
expect_line "$tmp/errN" "step 3 skipped: loss .*, 1 non-finite gradient values \(first in embed.weight\)" "skip logged"
"$PY" - "$tmp/N1" <<'PY' && ok || bad "skip recorded in metrics.jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert rows[2]["skipped"] is True and rows[2]["lr"] == 0 and rows[2]["skipped_total"] == 1
assert rows[1]["skipped"] is False and rows[5]["skipped_total"] == 1
PY
TREX_FAULT_NAN_STEPS=3,4,5 "$TREX" train "${common[@]}" --max-bad-steps 3 --out "$tmp/N3" >"$tmp/outN3" 2>"$tmp/errN3"; rc=$?
[ $rc -eq 1 ] && ok || bad "3 NaN steps in a row stop the run (exit $rc)"
expect_line "$tmp/errN3" "trex: error: stopping: 3 steps in a row \(3\.\.5\) had a NaN/Inf loss or gradient \(--max-bad-steps 3\); the weights are those after step 2; the last checkpoint .*/N3/step-2 is intact" "stop message"
[ -d "$tmp/N3/step-2" ] && [ ! -d "$tmp/N3/step-4" ] && ok || bad "no checkpoint during the bad streak"
"$TREX" train --resume "$tmp/N3" >/dev/null 2>"$tmp/errN4" && ok || { bad "resume after the stop"; cat "$tmp/errN4"; }
[ "$(losses "$tmp/A/metrics.jsonl")" = "$(losses "$tmp/N3/metrics.jsonl")" ] && ok || bad "resumed after the stop: same losses as the clean run"

# --- bf16 compute (--precision bf16): trains, recorded in the run, bitwise resume -----------------------------
"$TREX" train "${common[@]}" --precision bf16 --out "$tmp/P" >"$tmp/outP" 2>"$tmp/errP"; rc=$?
[ $rc -eq 0 ] && ok || { bad "bf16 run exit $rc"; cat "$tmp/errP"; }
expect_line "$tmp/outP" "precision=bf16" "bf16 in the effective settings"
"$PY" - "$tmp" <<'PY' && ok || bad "bf16 run: loss falls, differs from fp32, precision recorded"
import json, sys
d = sys.argv[1]
p = [json.loads(l) for l in open(d + "/P/metrics.jsonl")]
a = [json.loads(l) for l in open(d + "/A/metrics.jsonl")]
assert len(p) == 6 and p[-1]["loss_main"] < p[0]["loss_main"], "the loss falls"
assert p[0]["loss_main"] != a[0]["loss_main"], "bf16 products give other bits than fp32"
assert abs(p[0]["loss_main"] - a[0]["loss_main"]) < 0.01 * a[0]["loss_main"], "but close to fp32 at step 1"
assert json.load(open(d + "/P/settings.json"))["precision"] == "bf16"
assert json.load(open(d + "/A/settings.json"))["precision"] == "fp32"
assert json.load(open(d + "/P/step-6/trainer.json"))["precision"] == "bf16"
PY
TREX_FAULT_KILL_AFTER_STEP=3 "$TREX" train "${common[@]}" --precision bf16 --out "$tmp/Q" >/dev/null 2>&1; rc=$?
[ $rc -eq 137 ] && ok || bad "killed bf16 run exits 137, got $rc"
TREX_THREADS=1 "$TREX" train --resume "$tmp/Q" >"$tmp/outQ" 2>"$tmp/errQ" && ok || { bad "resume bf16 run"; cat "$tmp/errQ"; }
expect_line "$tmp/outQ" "precision=bf16" "the resumed run keeps bf16"
if [ "$(losses "$tmp/P/metrics.jsonl")" = "$(losses "$tmp/Q/metrics.jsonl")" ]; then ok; else
  bad "bf16: resumed losses differ"; diff <(losses "$tmp/P/metrics.jsonl") <(losses "$tmp/Q/metrics.jsonl"); fi
[ "$(body_sha "$tmp/P/step-6/model.safetensors")" = "$(body_sha "$tmp/Q/step-6/model.safetensors")" ] && ok || bad "bf16: final weights bitwise equal after resume"
[ "$(body_sha "$tmp/P/step-6/optim.safetensors")" = "$(body_sha "$tmp/Q/step-6/optim.safetensors")" ] && ok || bad "bf16: final optimizer state bitwise equal after resume"
# --- --recompute full: the same bf16 run bit for bit, keeping only each block's input --------------------------
"$TREX" train "${common[@]}" --precision bf16 --recompute full --out "$tmp/RF" >"$tmp/outRF" 2>"$tmp/errRF" && ok ||
  { bad "recompute full run"; cat "$tmp/errRF"; }
expect_line "$tmp/outRF" "recompute=full" "recompute in the effective settings"
[ "$(losses "$tmp/P/metrics.jsonl")" = "$(losses "$tmp/RF/metrics.jsonl")" ] && ok || bad "recompute full: same losses"
[ "$(body_sha "$tmp/P/step-6/model.safetensors")" = "$(body_sha "$tmp/RF/step-6/model.safetensors")" ] && ok ||
  bad "recompute full: same final weights"
# --- --weight-copies false: the same bf16 run bit for bit, the products from the fp32 weights ----------------
"$TREX" train "${common[@]}" --precision bf16 --weight-copies false --out "$tmp/WC" >"$tmp/outWC" 2>"$tmp/errWC" && ok ||
  { bad "weight-copies false run"; cat "$tmp/errWC"; }
expect_line "$tmp/outWC" "weight_copies=false" "weight_copies in the effective settings"
[ "$(losses "$tmp/P/metrics.jsonl")" = "$(losses "$tmp/WC/metrics.jsonl")" ] && ok || bad "weight-copies false: same losses"
[ "$(body_sha "$tmp/P/step-6/model.safetensors")" = "$(body_sha "$tmp/WC/step-6/model.safetensors")" ] && ok ||
  bad "weight-copies false: same final weights"
grep -Eq '"weight_copies":[[:space:]]*false' "$tmp/WC/settings.json" && ok || bad "weight-copies false: settings.json records it"
# --- --recompute attention / moe / full-keep-core / attention-keep-core: the same bf16 run bit for bit ------
for rec in attention moe full-keep-core attention-keep-core; do
  "$TREX" train "${common[@]}" --precision bf16 --recompute $rec --out "$tmp/R$rec" >"$tmp/outR$rec" 2>"$tmp/errR$rec" &&
    ok || { bad "recompute $rec run"; cat "$tmp/errR$rec"; }
  expect_line "$tmp/outR$rec" "recompute=$rec" "recompute $rec in the effective settings"
  [ "$(losses "$tmp/P/metrics.jsonl")" = "$(losses "$tmp/R$rec/metrics.jsonl")" ] && ok || bad "recompute $rec: same losses"
  cmp -s "$tmp/P/expert_load.jsonl" "$tmp/R$rec/expert_load.jsonl" && ok || bad "recompute $rec: same expert loads"
  [ "$(body_sha "$tmp/P/step-6/model.safetensors")" = "$(body_sha "$tmp/R$rec/step-6/model.safetensors")" ] && ok ||
    bad "recompute $rec: same final weights"
  grep -Eq "\"recompute\":[[:space:]]*\"$rec\"" "$tmp/R$rec/settings.json" && ok || bad "recompute $rec: settings.json records it"
done
err_case "bad precision" "--precision: 'fp16' is not a precision \(use fp32" "$TREX" train "${common[@]}" --precision fp16 --out "$tmp/E0"
err_case "bad muon_ns" "--muon-ns: 'fp16' is not a Newton-Schulz precision \\(use bf16" "$TREX" train "${common[@]}" --muon-ns fp16 --out "$tmp/E0m"
err_case "bad weight-copies" "--weight-copies: 'maybe' is not true or false" "$TREX" train "${common[@]}" --weight-copies maybe --out "$tmp/E0w"
err_case "bad recompute" "--recompute: 'some' is not a recompute policy \(use none; attention or moe" "$TREX" train "${common[@]}" --recompute some --out "$tmp/E0r"
err_case "resume with another precision" "--resume .*: precision = \"fp32\", but the run was started with precision = \"bf16\"" \
  "$TREX" train --resume "$tmp/P" --precision fp32 --steps 8

# --- bad input: clear errors, nothing lost ------------------------------------------------------------------
err_case "seq mismatch" "--data .*/sh: the shards hold sequences of 64 tokens \(manifest.json seq_len\) but --seq is 32" \
  "$TREX" train "${common[@]}" --seq 32 --out "$tmp/E1"
[ ! -e "$tmp/E1" ] && ok || bad "a refused run creates nothing"
"$TREX" data train-tokenizer --vocab 600 --in "$tmp/all.jsonl" --out "$tmp/tok2.json" --quiet
err_case "other tokenizer" "--data .*tokenizer" "$TREX" train "${common[@]}" --tokenizer "$tmp/tok2.json" --out "$tmp/E2"
err_case "existing run" "already holds a training run .* --resume" "$TREX" train "${common[@]}" --out "$tmp/A"
err_case "gbs not a multiple" "--gbs: 5 must be a positive multiple of --mbs 2" "$TREX" train "${common[@]}" --gbs 5 --out "$tmp/E3"
err_case "bad number" "--lr: 'fast' is not a finite number" "$TREX" train "${common[@]}" --lr fast --out "$tmp/E4"
err_case "resume another config" "rope_theta" "$TREX" train --resume "$tmp/A" --config "$tmp/other.json" --steps 8
err_case "resume another gbs" "--resume .*: gbs = 8, but the run was started with gbs = 4" "$TREX" train --resume "$tmp/A" --gbs 8 --mbs 2
err_case "resume nothing" "not a trex training run" "$TREX" train --resume "$tmp/nothing"
cp -r "$tmp/A" "$tmp/K"
before=$(cat "$tmp/K/metrics.jsonl" | sha256sum)
"$PY" -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,"rb").read()); b[len(b)//2]^=1; open(p,"wb").write(b)' "$tmp/K/step-6/model.safetensors"
err_case "corrupt checkpoint" "step-6/model.safetensors: checksum mismatch" "$TREX" train --resume "$tmp/K" --steps 8
[ "$(sha256sum <"$tmp/K/metrics.jsonl")" = "$before" ] && ok || bad "a failed resume keeps metrics.jsonl"
[ -d "$tmp/K/step-6" ] && [ -d "$tmp/K/step-4" ] && ok || bad "a failed resume keeps the checkpoints"
cp "$tmp/A/step-6/model.safetensors" "$tmp/K/step-6/model.safetensors"
truncate -s 1000 "$tmp/K/step-6/optim.safetensors"
err_case "truncated checkpoint" "step-6/optim.safetensors is truncated" "$TREX" train --resume "$tmp/K" --steps 8
err_case "generate from a corrupt checkpoint" "truncated|checksum" "$TREX" generate --run "$tmp/K" --prompt hi
mv "$tmp/K/step-6" "$tmp/K.step-6.bad"
"$TREX" train --resume "$tmp/K" --steps 8 >"$tmp/o" 2>"$tmp/e" && ok || { bad "resume from the previous checkpoint"; cat "$tmp/e"; }
expect_line "$tmp/o" "resuming .*/K at step 4 of 8" "falls back to step-4 once step-6 is moved away"

# --- run file, flags override it -------------------------------------------------------------------------------
cat >"$tmp/run.json" <<EOF
{"config": "$tmp/small.json", "data": "$tmp/sh", "tokenizer": "$tmp/tok.json", "steps": 3, "gbs": 2, "mbs": 1, "lr": 1e-3}
EOF
"$TREX" train --run-file "$tmp/run.json" --steps 2 --out "$tmp/R" >"$tmp/o" 2>&1 && ok || bad "run file"
[ "$(wc -l <"$tmp/R/metrics.jsonl")" -eq 2 ] && ok || bad "--steps overrides the run file"
"$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["gbs"]==2 and s["lr"]==1e-3' "$tmp/R/settings.json" && ok || bad "run-file values kept"
echo '{"stpes": 3}' >"$tmp/bad.json"
err_case "unknown run-file field" "unknown field \"stpes\"" "$TREX" train --run-file "$tmp/bad.json" --out "$tmp/E5"

# --- generate -----------------------------------------------------------------------------------------------------
"$TREX" generate --run "$tmp/A" --prompt "What is 3 plus 4?" --max-new 8 >"$tmp/g1" 2>"$tmp/ge" && ok || { bad "generate"; cat "$tmp/ge"; }
"$TREX" generate --run "$tmp/A" --prompt "What is 3 plus 4?" --max-new 8 >"$tmp/g2" 2>/dev/null
cmp -s "$tmp/g1" "$tmp/g2" && ok || bad "greedy generation is reproducible"
expect_line "$tmp/ge" "step-6: [0-9]+ prompt tokens, [0-9]+ new tokens" "generate summary"
"$TREX" generate --run "$tmp/A" --step 2 --prompt "hi" --temperature 1.0 --seed 5 --max-new 6 >"$tmp/g3" 2>/dev/null && ok || bad "sampling"
"$TREX" generate --run "$tmp/A" --step 2 --prompt "hi" --temperature 1.0 --seed 5 --max-new 6 >"$tmp/g4" 2>/dev/null
cmp -s "$tmp/g3" "$tmp/g4" && ok || bad "sampling is a function of the seed"
err_case "generate missing step" "step-3: no such checkpoint directory" "$TREX" generate --run "$tmp/A" --step 3 --prompt hi

finish
