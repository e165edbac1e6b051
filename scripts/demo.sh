#!/usr/bin/env bash
# The main job, for `make demo`: the whole post-training workflow on dsv4-tiny, on two CPU cores in a
# few minutes, from solver-verified operations-research data:
#   1. generate the data with `trex data or-gen`: CODE samples (a word problem in, a CPLEX LP file out)
#      of the families whose small instances are short, bounded by --max-chars so that each sample fits
#      a 512-token sequence, plus a few CPT documents; train a byte-level BPE tokenizer on it;
#   2. tokenize it into shards: CPT documents, SFT samples (chat template, loss on the answers) and a
#      held-out SFT set;
#   3. continued pre-training of dsv4-tiny from random weights (trex train), then SFT from the CPT
#      checkpoint with evaluation on the held-out set, printing the loss as it falls;
#   4. answer held-out problems with the SFT checkpoint (trex eval or, greedy): each answer's LP block is
#      solved with GLPK and its optimum compared with the verified one; the accuracy is reported as it
#      is (a 16M-parameter model after a two-minute SFT is not expected to get them right).
# Usage: scripts/demo.sh [BUILD]   (env: TREX_THREADS, default 2; DEMO_DIR to keep the run, default a
# temporary folder that is removed; DEMO_CPT_STEPS, DEMO_SFT_STEPS to change the length; DEMO_SEED, the
# or-gen seed; DEMO_EVAL_N held-out problems answered, 0 to skip; DEMO_DATA=demo trains on the small
# hand-written corpus of data/demo/ instead (arithmetic and word games, the demo before the OR data))
set -euo pipefail
build=${1:-build}
trex=$build/trex
py=/usr/bin/python3
export TREX_THREADS=${TREX_THREADS:-2}
data=${DEMO_DATA:-or}
case "$data" in
  or) cpt_steps=${DEMO_CPT_STEPS:-20} sft_steps=${DEMO_SFT_STEPS:-100} ;;
  demo) cpt_steps=${DEMO_CPT_STEPS:-30} sft_steps=${DEMO_SFT_STEPS:-200} ;;
  *) echo "scripts/demo.sh: DEMO_DATA=$data: use or (the default) or demo" >&2; exit 2 ;;
esac
if [ ! -x "$trex" ]; then
  echo "scripts/demo.sh: $trex not found: build first (make BUILD=$build all), or run make demo" >&2
  exit 2
fi
if [ -n "${DEMO_DIR:-}" ]; then
  work=$DEMO_DIR
  mkdir -p "$work"
  rm -rf "$work/or" "$work/cpt" "$work/sft" "$work/heldout" "$work/run-cpt" "$work/run-sft"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
# a failing command stops the demo with the name of the stage it was in (its own message is above)
stage=setup
trap 'rc=$?; echo "make demo: FAILED in stage \"$stage\" (exit $rc); the messages above say why" >&2; exit $rc' ERR
start=$SECONDS
at() { echo "[$((SECONDS - start)) s]"; }

echo "== trex demo: post-training DeepSeek-V4 (dsv4-tiny) on $TREX_THREADS CPU threads =="
if [ "$data" = or ]; then
  # The families whose CODE samples are shortest (small instances of 900-1100 characters, about 250-450
  # tokens); --max-chars rejects the longer instances (OVER_MAX_CHARS in the manifest's funnel).
  fams=knapsack,shortest_path,diet,set_cover,lot_sizing,max_flow,bin_packing,parallel_machines,staff_scheduling
  eval_n=${DEMO_EVAL_N:-3}
  held=$((12 > eval_n ? 12 : eval_n))
  seq=${DEMO_SEQ:-512} cpt_gbs=1 sft_gbs=1 lr=${DEMO_LR:-2e-3}
  stage="1. or-gen"
  echo "== 1. data: trex data or-gen (CODE samples of $(echo "$fams" | tr ',' ' ' | wc -w) families, at most 1100 characters each) $(at)"
  "$trex" data or-gen --out "$work/or" --seed "${DEMO_SEED:-1}" --sft $((sft_steps * sft_gbs + held)) \
    --cpt "${DEMO_OR_CPT:-16}" --tasks code --families "$fams" --max-chars 1100 --no-system --quiet
  "$py" - "$work/or/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for k in ("sft", "cpt"):
    f = m[k]["funnel"]
    rej = ", ".join(f"{n} {c}" for n, c in sorted(f["rejected"].items(), key=lambda x: -x[1])) or "none"
    print(f"or-gen {k}: {f['written']} written of {f['attempted']} attempts (rejected: {rej})")
PY
  cpt_src=$work/or/cpt.jsonl sft_src=$work/or/sft.jsonl
else
  eval_n=0
  held=20 seq=${DEMO_SEQ:-64} cpt_gbs=4 sft_gbs=2 lr=${DEMO_LR:-2e-3}
  cpt_src=data/demo/cpt.jsonl sft_src=data/demo/sft.jsonl
  prompts=("What is 7 plus 5?" "Reverse the word garden.")
fi
stage="1. tokenizer"
echo "== 1. corpus ($(dirname "$cpt_src")): $(wc -l <"$cpt_src") CPT documents, $(wc -l <"$sft_src") SFT samples; tokenizer $(at)"
cat "$cpt_src" "$sft_src" >"$work/all.jsonl"
"$trex" data train-tokenizer --vocab 4096 --in "$work/all.jsonl" --out "$work/tokenizer.json"
# dsv4-tiny with the tokenizer's vocabulary size (the model's vocab_size must cover every id)
vocab=$("$py" -c 'import json,sys; t=json.load(open(sys.argv[1])); print(1+max(list(t["model"]["vocab"].values())+[a["id"] for a in t["added_tokens"]]))' "$work/tokenizer.json")
"$py" -c 'import json,sys; c=json.load(open("configs/dsv4-tiny.json")); c["vocab_size"]=int(sys.argv[2]); json.dump(c,open(sys.argv[1],"w"),indent=1)' \
  "$work/dsv4-tiny-demo.json" "$vocab"
echo "demo config: configs/dsv4-tiny.json with vocab_size $vocab"

stage="2. token shards"
echo "== 2. token shards (sequences of $seq tokens) $(at)"
head -n "-$held" "$sft_src" >"$work/sft-train.jsonl"
tail -n "$held" "$sft_src" >"$work/sft-heldout.jsonl"
"$trex" data tokenize --tokenizer "$work/tokenizer.json" --format cpt --seq "$seq" --in "$cpt_src" --out "$work/cpt" --quiet
"$trex" data tokenize --tokenizer "$work/tokenizer.json" --format sft --seq "$seq" --in "$work/sft-train.jsonl" --out "$work/sft" --quiet
"$trex" data tokenize --tokenizer "$work/tokenizer.json" --format sft --seq "$seq" --in "$work/sft-heldout.jsonl" --out "$work/heldout" --quiet

# MFU denominator: the fp32 FMA peak of the threads used, measured now (trex bench peak; docs/mfu.md)
stage="MFU peak"
peak=$("$trex" bench peak --json --threads "$TREX_THREADS" --reps 3 --seconds 0.2 |
  "$py" -c 'import json,sys; p=json.load(sys.stdin)["peak_tflops"]; print((p.get("avx512_fp32_fma") or p["avx2_fp32_fma"])["all_threads"])' 2>/dev/null || echo 0)
echo "MFU peak: ${peak} TFLOP/s (trex bench peak, fp32 FMA: AVX-512, else AVX2; $TREX_THREADS threads; 0 = the cluster file's)"

stage="3a. CPT"
echo "== 3a. continued pre-training: $cpt_steps steps of ${cpt_gbs}x$seq tokens from random weights $(at)"
"$trex" train --config "$work/dsv4-tiny-demo.json" --tokenizer "$work/tokenizer.json" --data "$work/cpt" \
  --out "$work/run-cpt" --steps "$cpt_steps" --seq "$seq" --gbs "$cpt_gbs" --mbs "$cpt_gbs" --optimizer adamw --lr 2e-3 --warmup $((cpt_steps / 6)) \
  --min-lr 5e-4 --expert-load-every 0 --seed 1 --peak-tflops "$peak"

stage="3b. SFT"
echo "== 3b. SFT: $sft_steps steps of ${sft_gbs}x$seq tokens from the CPT checkpoint, evaluated on $(wc -l <"$work/sft-heldout.jsonl") held-out samples $(at)"
"$trex" train --config "$work/dsv4-tiny-demo.json" --tokenizer "$work/tokenizer.json" --data "$work/sft" \
  --init "$work/run-cpt/step-$cpt_steps/model.safetensors" --eval-data "$work/heldout" --eval-every $(((sft_steps + 1) / 2)) \
  --out "$work/run-sft" --steps "$sft_steps" --seq "$seq" --gbs "$sft_gbs" --mbs "$sft_gbs" --optimizer adamw --lr "$lr" --warmup $((sft_steps / 20)) \
  --min-lr 2e-4 --save-every $(((sft_steps + 1) / 2)) --keep 2 --seed 1 --peak-tflops "$peak"

stage="loss summary"
"$py" - "$work/run-cpt/metrics.jsonl" "$work/run-sft/metrics.jsonl" <<'PY'
import json, sys
for name, path in zip(("CPT", "SFT"), sys.argv[1:]):
    rows = [json.loads(l) for l in open(path)]
    def avg(rs): return sum(r["loss_main"] for r in rs) / len(rs)
    k = max(1, len(rows) // 10)
    ev = [r for r in rows if "eval_loss" in r]
    print(f"{name}: loss (mean of {k} steps) {avg(rows[:k]):.3f} at the start -> {avg(rows[-k:]):.3f} at the end"
          f" over {len(rows)} steps; {sum(r['tokens_per_s'] for r in rows) / len(rows):.0f} tokens/s"
          + (f"; held-out loss {ev[-1]['eval_loss']:.3f}" if ev else ""))
PY

if [ "$data" = or ]; then
  if [ "$eval_n" -gt 0 ]; then
    stage="4. trex eval or"
    echo "== 4. the SFT checkpoint answers $eval_n held-out problems (trex eval or, greedy; the answer's LP is solved with GLPK) $(at)"
    tail -n "$eval_n" "$work/sft-heldout.jsonl" >"$work/eval-set.jsonl"
    "$trex" eval or --run "$work/run-sft" --set "$work/eval-set.jsonl" --max-new "${DEMO_MAX_NEW:-160}" \
      --out "$work/eval-results.jsonl" --quiet | tail -n +2
    "$py" - "$work/eval-set.jsonl" "$work/eval-results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
res = [json.loads(l) for l in open(sys.argv[2])]
r, e = rows[0], res[0]
q = next(m["content"] for m in r["messages"] if m["role"] == "user")
ref = next(m["content"] for m in r["messages"] if m["role"] == "assistant")
print("first problem (" + r["metadata"]["family"] + "), question:\n  " + q.replace("\n", "\n  "))
print("reference answer (optimum %s):\n  %s" % (r["metadata"]["objective"], ref.strip().replace("\n", "\n  ")))
print("model answer (%d tokens; LP %s%s):\n  %s" % (e["new_tokens"], e["lp"],
      "" if e["lp"] != "parsed" else ", GLPK: %s, objective %s" % (e.get("lp_status"), e.get("lp_objective")),
      e["output"].strip().replace("\n", "\n  ")))
PY
  fi
else
  stage="4. generation"
  echo "== 4. generation with the SFT checkpoint (greedy) $(at)"
  for prompt in "${prompts[@]}"; do
    echo "prompt: $prompt"
    printf 'answer: '
    "$trex" generate --run "$work/run-sft" --prompt "$prompt" --max-new 32
  done
fi
echo "== demo done in $((SECONDS - start)) s"
