#!/usr/bin/env bash
# bench/loss_curve.sh — does bf16 training track fp32? (issue 4 target: "bf16 training of dsv4-tiny
# tracks the fp32 loss curve within 1% over 300 steps"; docs/precision.md "Training in bf16")
#
# Trains dsv4-tiny (with the demo tokenizer's vocabulary) twice on the CPT part of the demo corpus
# (data/demo/cpt.jsonl, sequences of 64 tokens), identical in everything (data, order, seed, initial
# weights, AdamW, lr 2e-3 with a warmup of STEPS/15 steps and a cosine decay to 2e-4) except --precision fp32 / bf16, and compares the two loss_main curves:
#   ma_p(s)   = mean of loss_main over steps s-W+1 .. s of run p (W = 10, s >= W)
#   rel(s)    = |ma_bf16(s) - ma_fp32(s)| / ma_fp32(s)
#   max_rel   = max over s of rel(s)            (the target: <= 0.01)
#   final_rel = rel(STEPS)                      (the last W steps)
# and also the largest single-step relative difference, for information (single steps are noisy).
# Usage: bench/loss_curve.sh [BUILD]   env: STEPS (300), GBS (2), SEQ (64), THREADS (1 per run; the two
# runs go side by side), WORK (keep the runs there; default a temporary folder).
set -euo pipefail
build=${1:-build}
trex=$build/trex
py=/usr/bin/python3
steps=${STEPS:-300}
gbs=${GBS:-2}
seq=${SEQ:-64}
threads=${THREADS:-1}
if [ -n "${WORK:-}" ]; then
  work=$WORK
  mkdir -p "$work"
  rm -rf "$work/run-fp32" "$work/run-bf16" "$work/cpt"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi

"$trex" data train-tokenizer --vocab 4096 --in data/demo/cpt.jsonl --out "$work/tokenizer.json" --quiet
vocab=$("$py" -c 'import json,sys; t=json.load(open(sys.argv[1])); print(1+max(list(t["model"]["vocab"].values())+[a["id"] for a in t["added_tokens"]]))' "$work/tokenizer.json")
"$py" -c 'import json,sys; c=json.load(open("configs/dsv4-tiny.json")); c["vocab_size"]=int(sys.argv[2]); json.dump(c,open(sys.argv[1],"w"),indent=1)' \
  "$work/dsv4-tiny-demo.json" "$vocab"
"$trex" data tokenize --tokenizer "$work/tokenizer.json" --format cpt --seq "$seq" --in data/demo/cpt.jsonl --out "$work/cpt" --quiet >/dev/null

echo "loss_curve: dsv4-tiny (vocab $vocab), $steps steps of $gbs x $seq tokens, AdamW lr 2e-3 (warmup $((steps / 15)), cosine to 2e-4), seed 1, $threads thread(s) per run"
for p in fp32 bf16; do
  TREX_THREADS=$threads "$trex" train --config "$work/dsv4-tiny-demo.json" --tokenizer "$work/tokenizer.json" \
    --data "$work/cpt" --out "$work/run-$p" --steps "$steps" --seq "$seq" --gbs "$gbs" --mbs "$gbs" \
    --optimizer adamw --lr 2e-3 --warmup $((steps / 15)) --min-lr 2e-4 --expert-load-every 0 --keep 1 --seed 1 \
    --peak-tflops 1 --precision "$p" >"$work/log-$p" 2>&1 &
done
fail=0
for job in $(jobs -p); do wait "$job" || fail=1; done
if [ $fail -ne 0 ]; then
  tail -n 5 "$work"/log-*
  echo "loss_curve: a training run failed" >&2
  exit 1
fi

"$py" - "$work/run-fp32/metrics.jsonl" "$work/run-bf16/metrics.jsonl" <<'PY'
import json, sys
W = 10
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in a] == [r["step"] for r in b], "the runs have different steps"
la = [r["loss_main"] for r in a]
lb = [r["loss_main"] for r in b]
n = len(la)
def ma(v, s): return sum(v[s - W + 1:s + 1]) / W
rel = [(s + 1, abs(ma(lb, s) - ma(la, s)) / ma(la, s)) for s in range(W - 1, n)]
worst = max(rel, key=lambda x: x[1])
single = max(((s + 1, abs(lb[s] - la[s]) / la[s]) for s in range(n)), key=lambda x: x[1])
print(f"steps {n}; loss_main fp32 {la[0]:.4f} -> {la[-1]:.4f}, bf16 {lb[0]:.4f} -> {lb[-1]:.4f}")
print(f"{W}-step moving average at the end: fp32 {ma(la, n - 1):.5f}, bf16 {ma(lb, n - 1):.5f}")
print(f"max_rel {worst[1]:.5f} (step {worst[0]}), final_rel {rel[-1][1]:.5f}, "
      f"largest single-step difference {single[1]:.5f} (step {single[0]})")
for s in (W, 50, 100, 150, 200, 250, n):
    if W <= s <= n:
        print(f"  step {s:4d}: ma fp32 {ma(la, s - 1):.4f}  bf16 {ma(lb, s - 1):.4f}  rel {rel[s - W][1]:.5f}")
tps = [sum(r["tokens_per_s"] for r in x[1:]) / (n - 1) for x in (a, b)]
print(f"mean tokens/s (for information; both runs shared the machine): fp32 {tps[0]:.0f}, bf16 {tps[1]:.0f}")
print("target (max_rel <= 0.01):", "met" if worst[1] <= 0.01 else "NOT met")
PY
