#!/usr/bin/env bash
# tests/test_pytorch_step.sh — bench/pytorch_step.py (the tests/ref model trained in PyTorch, the other
# side of bench/compare.sh) on dsv4-tiny, T=32, 1 warm-up + 1 timed step:
#   1. bf16 autocast run: exit 0, one valid JSON object with the fields compare.sh and docs/perf.md use,
#      finite losses, tokens_per_s > 0;
#   2. it is the same model as trex: with --fp32 the first step's losses (total and the 4 parts) on the
#      weights of `trex model init` and the tokens it saved (--save-batch) equal `trex model run`'s
#      within 1e-5 relative (both fp32; the ref-compare tolerance on losses);
#   3. the bf16 loss is within 2% of the fp32 one (autocast is on, and sane);
#   4. bad input is refused: --seq 0 and --optimizer muon exit non-zero with a message naming the flag;
#   5. compare.sh refuses a bad --rounds and a missing binary (its logic without the big runs).
# Env: TREX (default build/trex), PYTHON (default /usr/bin/python3, with torch and numpy).
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.." || exit 1
export PYTHONDONTWRITEBYTECODE=1
CFG=configs/dsv4-tiny.json

if ! "$TREX" model init --config "$CFG" --seed 1 --out "$tmp/w.safetensors" >"$tmp/init.log" 2>&1; then
  cat "$tmp/init.log"; bad "model init"; finish
fi

common=(--config "$CFG" --seq 32 --mbs 1 --steps 1 --warmup 1 --threads 1 --weights "$tmp/w.safetensors"
        --indexer-mode sparse --json)

# 1. bf16 autocast
if "$PY" bench/pytorch_step.py "${common[@]}" >"$tmp/bf16.json" 2>"$tmp/bf16.err"; then
  if "$PY" - "$tmp/bf16.json" <<'EOF'
import json, math, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
need = ["tokens_per_s", "step_s", "cpu_s", "peak_rss_mib", "seq", "mbs", "threads", "torch_version",
        "first_loss", "losses", "precision"]
miss = [k for k in need if k not in j]
assert not miss, f"missing fields {miss}"
assert j["precision"] == "bf16-autocast" and j["seq"] == 32 and j["mbs"] == 1 and j["threads"] == 1, j
assert len(j["losses"]) == 2 and all(math.isfinite(x) for x in j["losses"]), j["losses"]
assert j["tokens_per_s"] > 0 and j["peak_rss_mib"] > 0, j
EOF
  then ok "bf16 run: valid JSON, finite losses"; else bad "bf16 run: JSON check"; fi
else
  tail -n 20 "$tmp/bf16.err"; bad "bf16 run (exit status)"
fi

# 2. fp32: same losses as trex model run on the same weights and tokens
if "$PY" bench/pytorch_step.py "${common[@]}" --fp32 --save-batch "$tmp/batch.safetensors" \
     >"$tmp/fp32.json" 2>"$tmp/fp32.err"; then
  if "$TREX" model run --config "$CFG" --weights "$tmp/w.safetensors" --batch "$tmp/batch.safetensors" \
       --out "$tmp/c.safetensors" --indexer-mode sparse --no-logits >"$tmp/run.log" 2>&1; then
    if "$PY" - "$tmp/fp32.json" "$tmp/c.safetensors" "$tmp/bf16.json" <<'EOF'
import json, sys
sys.path.insert(0, "tests/ref")
import st
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
c, _ = st.load(sys.argv[2])
worst = 0.0
for k, v in j["first_losses"].items():
    ref = float(c[k].reshape(-1)[0])
    err = abs(v - ref) / max(abs(ref), 1e-6)
    print(f"  {k}: pytorch fp32 {v:.8g}  trex {ref:.8g}  rel err {err:.2e}")
    worst = max(worst, err)
assert worst <= 1e-5, f"fp32 losses differ from trex's: worst rel err {worst:.2e}"
jb = json.loads(open(sys.argv[3]).read().strip().splitlines()[-1])
rel = abs(jb["first_loss"] - j["first_loss"]) / abs(j["first_loss"])
print(f"  bf16 loss {jb['first_loss']:.6f} vs fp32 {j['first_loss']:.6f}: rel {rel:.2e}")
sys.exit(0 if rel <= 0.02 else 2)
EOF
    then ok "fp32 first-step losses equal trex model run's; bf16 within 2%"
    else
      rc=$?
      if [ "$rc" -eq 2 ]; then ok "fp32 first-step losses equal trex model run's"; bad "bf16 loss vs fp32"
      else bad "fp32 losses vs trex model run"; fi
    fi
  else
    tail -n 20 "$tmp/run.log"; bad "trex model run failed"
  fi
else
  tail -n 20 "$tmp/fp32.err"; bad "fp32 run (exit status)"
fi

# 4. bad input
if "$PY" bench/pytorch_step.py --config "$CFG" --seq 0 >/dev/null 2>"$tmp/e1"; then bad "--seq 0 accepted"
elif grep -q -- "--seq" "$tmp/e1"; then ok "--seq 0 refused"; else cat "$tmp/e1"; bad "--seq 0: no message"; fi
if "$PY" bench/pytorch_step.py --config "$CFG" --seq 8 --optimizer muon >/dev/null 2>"$tmp/e2"; then
  bad "--optimizer muon accepted"
elif grep -q -- "--optimizer" "$tmp/e2"; then ok "--optimizer muon refused"; else cat "$tmp/e2"; bad "--optimizer: no message"; fi

# 5. compare.sh argument checks (no runs)
if bash bench/compare.sh --config "$CFG" --rounds 0 >/dev/null 2>"$tmp/e3"; then bad "compare.sh --rounds 0 accepted"
elif grep -q -- "--rounds" "$tmp/e3"; then ok "compare.sh --rounds 0 refused"; else cat "$tmp/e3"; bad "compare.sh --rounds: no message"; fi
if TREX="$tmp/none" bash bench/compare.sh --config "$CFG" >/dev/null 2>"$tmp/e4"; then bad "compare.sh without trex accepted"
elif grep -q "not found" "$tmp/e4"; then ok "compare.sh: missing binary refused"; else cat "$tmp/e4"; bad "compare.sh missing binary: no message"; fi

finish
