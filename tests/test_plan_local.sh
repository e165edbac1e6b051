#!/usr/bin/env bash
# tests/test_plan_local.sh — the planner's memory for a local run against the run itself: for a few
# batches of dsv4-tiny, `trex model run --backward --no-logits --threads T` prints its per-region
# accounting (trex_mem) and peak RSS; `trex plan` on configs/clusters/local.json (engine fp32-ref,
# T = its fp32_ref.threads) with --explain prints the same line predicted from the layout and the
# replay of the engine's allocations (src/plan/engine.c). Parameters, gradients and the activation
# arena's reserved bytes must agree to the printed 0.1 MiB (for every recompute policy), the arena's bytes in
# use after the pass and at its peak within 1%, the peak RSS within 5%; and the same for a 2-step `trex train` run. No timing is checked here (docs/perf.md "Planner vs this machine" records the
# step-time comparison).
# Env: TREX = the trex binary, PYTHON (only to write the small batch files). Prints `N passed, N failed`.
. "$(dirname "$0")/lib.sh"
CFG=configs/dsv4-tiny.json
CLUSTER=configs/clusters/local.json

# within A B TOL: |A/B - 1| <= TOL
within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { e = a / b - 1; if (e < 0) e = -e; exit !(b > 0 && e <= t) }'; }
# the seven numbers of a memory line: rss params grads acts used reserved peak
mem_fields() {
  sed -n 's/.*memory: peak RSS \([0-9.]*\) MiB; peak by region: params \([0-9.]*\) MiB grads \([0-9.]*\) MiB acts \([0-9.]*\) MiB; activations used \([0-9.]*\) MiB of \([0-9.]*\) MiB reserved, peak \([0-9.]*\) MiB.*/\1 \2 \3 \4 \5 \6 \7/p' "$1" | head -n 1
}

# the checker itself must reject what it should
within 104.9 100.0 0.05 && ok || bad "within: 4.9% must pass"
within 106.0 100.0 0.05 && bad "within: 6% must fail" || ok
within 94.0 100.0 0.05 && bad "within: -6% must fail" || ok

threads=$(sed -n 's/.*"threads": *\([0-9]*\).*/\1/p' "$CLUSTER" | head -n 1)
if [ -z "$threads" ] || ! grep -q '"engine": *"fp32-ref"' "$CLUSTER"; then
  bad "$CLUSTER: no engine fp32-ref / fp32_ref.threads (run bench/plan_local.sh --write)"
  finish
fi

"$PY" - "$tmp" <<'EOF' || { bad "cannot write the batch files"; finish; }
import json, struct, sys
def save(path, B, T, V=4096):
    vals = [(i * 2654435761 + 12345) % V for i in range(B * T)]
    b = struct.pack("<%di" % len(vals), *vals)
    h = json.dumps({"tokens": {"dtype": "I32", "shape": [B, T], "data_offsets": [0, len(b)]}}).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b)
for B, T in ((1, 128), (2, 100), (1, 192)):
    save("%s/b%dx%d.st" % (sys.argv[1], B, T), B, T)
EOF
if ! "$TREX" model init --config "$CFG" --seed 5 --out "$tmp/w.st" >/dev/null 2>"$tmp/init.err"; then
  cat "$tmp/init.err"; bad "model init"; finish
fi

for bt in 1x128 2x100 1x192 1x192:full 1x192:attention 1x192:moe 1x192:full-keep-core 1x192:attention-keep-core; do  # B x T[:recompute policy]
  rec=none
  case $bt in *:*) rec=${bt#*:}; esac
  B=${bt%%x*}
  T=${bt#*x}
  T=${T%%:*}
  if ! "$TREX" model run --config "$CFG" --weights "$tmp/w.st" --batch "$tmp/b${B}x$T.st" --out "$tmp/o.st" \
       --backward --no-logits --threads "$threads" --recompute "$rec" >"$tmp/run$bt" 2>&1; then
    bad "model run $bt: $(tail -n 3 "$tmp/run$bt")"; continue
  fi
  if ! "$TREX" plan --model "$CFG" --cluster "$CLUSTER" --devices 1 --seq "$T" --gbs "$B" --optimizer adamw \
       --layout "tp=1,pp=1,ep=1,cp=1,zero=0,recompute=$rec,mbs=$B" --explain >"$tmp/plan$bt" 2>&1; then
    bad "plan $bt: $(tail -n 3 "$tmp/plan$bt")"; continue
  fi
  ok
  run=$(mem_fields "$tmp/run$bt")
  pred=$(grep -A3 'as `trex model run' "$tmp/plan$bt" | mem_fields /dev/stdin)
  if [ -z "$run" ] || [ -z "$pred" ]; then
    bad "$bt: memory line missing (run: '$run', plan: '$pred')"; sed 's/^/    /' "$tmp/run$bt" "$tmp/plan$bt" | tail -20; continue
  fi
  read -r r_rss r_par r_grd r_act r_used r_res r_peak <<<"$run"
  read -r p_rss p_par p_grd p_act p_used p_res p_peak <<<"$pred"
  echo "  $bt: run    peak RSS $r_rss MiB, params $r_par, grads $r_grd, acts $r_act (used $r_used of $r_res, peak $r_peak)"
  echo "  $bt: plan   peak RSS $p_rss MiB, params $p_par, grads $p_grd, acts $p_act (used $p_used of $p_res, peak $p_peak)"
  [ "$r_par" = "$p_par" ] && ok || bad "$bt params: run $r_par MiB, planner $p_par MiB"
  [ "$r_grd" = "$p_grd" ] && ok || bad "$bt grads: run $r_grd MiB, planner $p_grd MiB"
  [ "$r_act" = "$p_act" ] && ok || bad "$bt acts region (arena reserved): run $r_act MiB, planner $p_act MiB"
  [ "$r_res" = "$p_res" ] && ok || bad "$bt arena reserved: run $r_res MiB, planner $p_res MiB"
  # the replay is exact today; 1% (the issue asks 5%) still lets a small buffer added to the engine pass
  within "$p_used" "$r_used" 0.01 && ok || bad "$bt activations in use: run $r_used MiB, planner $p_used MiB (> 1%)"
  # and the arena's high-water mark, which the order of every carve and rewind sets (a core not taken
  # by a keep-core policy's second forward, or a replay that skips the wrong blocks, moves it)
  within "$p_peak" "$r_peak" 0.01 && ok || bad "$bt activations at the peak: run $r_peak MiB, planner $p_peak MiB (> 1%)"
  within "$p_rss" "$r_rss" 0.05 && ok || bad "$bt peak RSS: run $r_rss MiB, planner $p_rss MiB (> 5%)"
done

# a training run (trex train, AdamW, 2 steps of 2 micro-batches of 1 x 128): the regions it accounts
# (metrics.jsonl mem_mib = params + grads + optimizer state + arena) and its peak RSS against the
# planner's training view (fp32_engine regions, memory per device)
cat data/demo/cpt.jsonl >"$tmp/cpt.jsonl"
if "$TREX" data train-tokenizer --vocab 512 --in "$tmp/cpt.jsonl" --out "$tmp/tok.json" --quiet >/dev/null 2>&1 &&
   "$TREX" data tokenize --tokenizer "$tmp/tok.json" --format cpt --seq 128 --in "$tmp/cpt.jsonl" --out "$tmp/sh" \
     --quiet >/dev/null 2>&1 &&
   "$TREX" train --config "$CFG" --data "$tmp/sh" --tokenizer "$tmp/tok.json" --out "$tmp/run" --steps 2 --gbs 2 \
     --mbs 1 --optimizer adamw --threads "$threads" --save-every 0 --keep 1 >"$tmp/train.log" 2>&1 &&
   "$TREX" plan --model "$CFG" --cluster "$CLUSTER" --devices 1 --seq 128 --gbs 2 --optimizer adamw \
     --layout "tp=1,pp=1,ep=1,cp=1,zero=0,recompute=none,mbs=1" --explain --json >"$tmp/trainplan.json" 2>&1; then
  cat >"$tmp/cmp.py" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
p = json.load(open(sys.argv[2]))["layouts"][0]
e = p["fp32_engine"]
print("%.1f %.1f %.1f %.1f" % (max(r["mem_mib"] for r in rows), max(r["peak_rss_mib"] for r in rows),
      e["params_mib"] + e["grads_mib"] + e["optim_mib"] + e["acts_reserved_mib"], p["mem_per_device_gb"] * 1024))
EOF
  read -r m_regions m_rss p_regions p_mem <<<"$("$PY" "$tmp/cmp.py" "$tmp/run/metrics.jsonl" "$tmp/trainplan.json")"
  echo "  train 2 x (1x128): run    regions $m_regions MiB, peak RSS $m_rss MiB"
  echo "  train 2 x (1x128): plan   regions $p_regions MiB, memory per device $p_mem MiB"
  [ -n "$m_regions" ] && [ "$m_regions" = "$p_regions" ] && ok ||
    bad "train regions (params + grads + optim + arena): run $m_regions MiB, planner $p_regions MiB"
  [ -n "$m_rss" ] && within "$p_mem" "$m_rss" 0.05 && ok || bad "train peak RSS: run $m_rss MiB, planner $p_mem MiB (> 5%)"
else
  bad "train run / plan failed: $(tail -n 3 "$tmp/train.log" "$tmp/trainplan.json" 2>/dev/null)"
fi

# the command line on the local cluster: one process only, DeepSeek-V4 only, --json --explain
"$TREX" plan --model "$CFG" --cluster "$CLUSTER" --devices 2 --seq 128 --gbs 2 >/dev/null 2>"$tmp/err2"; rc=$?
[ $rc -eq 1 ] && grep -q -- '--devices 1' "$tmp/err2" && ok || bad "--devices 2 on $CLUSTER: exit $rc, $(cat "$tmp/err2")"
"$TREX" plan --model configs/hf/qwen3-235b-a22b.json --cluster "$CLUSTER" --devices 1 --seq 128 --gbs 1 \
  >/dev/null 2>"$tmp/errq"; rc=$?
[ $rc -eq 1 ] && grep -q 'DeepSeek-V4 configs only' "$tmp/errq" && ok || bad "a Qwen config on $CLUSTER: exit $rc, $(cat "$tmp/errq")"
"$TREX" plan --model "$CFG" --cluster "$CLUSTER" --devices 1 --seq 128 --gbs 1 --json --explain \
  --layout "tp=1,pp=1,ep=1,cp=1,zero=0,recompute=none,mbs=1" >"$tmp/j" 2>&1 && grep -q '"fp32_engine"' "$tmp/j" &&
  grep -q '"acts_reserved_mib"' "$tmp/j" && ok || bad "--json --explain lacks fp32_engine: $(head -c 300 "$tmp/j")"

# every recompute policy holds less after the backward than keeping every block's activations (the
# plan was checked against each run above)
for rec in full attention moe full-keep-core attention-keep-core; do
  if [ -f "$tmp/run1x192" ] && [ -f "$tmp/run1x192:$rec" ]; then
    u_keep=$(mem_fields "$tmp/run1x192" | cut -d' ' -f5)
    u_rec=$(mem_fields "$tmp/run1x192:$rec" | cut -d' ' -f5)
    awk -v a="$u_rec" -v b="$u_keep" 'BEGIN { exit !(a < b) }' && ok ||
      bad "recompute $rec does not hold less: $u_rec MiB vs $u_keep MiB"
  else
    bad "recompute $rec: no run of 1x192 to compare"
  fi
done
# the cluster model has no attention / moe / keep-core policy: a GPU cluster refuses them with a
# clear message
for rec in moe full-keep-core attention-keep-core; do
  "$TREX" plan --model "$CFG" --cluster configs/clusters/h800.json --devices 8 --seq 128 --gbs 8 \
    --layout "tp=1,pp=1,ep=8,cp=1,zero=1,recompute=$rec,mbs=1" >/dev/null 2>"$tmp/errm"; rc=$?
  [ $rc -eq 1 ] && grep -q "recompute=$rec is a policy of" "$tmp/errm" && ok ||
    bad "recompute=$rec on a GPU cluster: exit $rc, $(cat "$tmp/errm")"
done

# a mismatched pair (the prediction for 1x128 against the run of 1x192) must not pass: the comparison
# discriminates batches
if [ -f "$tmp/run1x192" ] && [ -f "$tmp/plan1x128" ]; then
  u1=$(mem_fields "$tmp/run1x192" | cut -d' ' -f5)
  u2=$(grep -A3 'as `trex model run' "$tmp/plan1x128" | mem_fields /dev/stdin | cut -d' ' -f5)
  within "$u2" "$u1" 0.05 && bad "activations of 1x128 (planned $u2 MiB) match a 1x192 run ($u1 MiB)" || ok
fi

finish
