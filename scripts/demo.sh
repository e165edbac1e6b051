#!/usr/bin/env bash
# The main job, for `make demo`: the whole post-training workflow on dsv4-tiny, on two CPU cores in a
# few minutes, from the small corpus that ships with trex (data/demo/, written by
# data/demo/make_demo.py):
#   1. train a byte-level BPE tokenizer on the corpus (trex data train-tokenizer);
#   2. tokenize it into shards: CPT documents, SFT samples (chat template, loss on the answers) and a
#      held-out SFT set;
#   3. continued pre-training of dsv4-tiny from random weights (trex train), then SFT from the CPT
#      checkpoint with evaluation on the held-out set, printing the loss as it falls;
#   4. answer two prompts with the SFT checkpoint (trex generate, greedy).
# Usage: scripts/demo.sh [BUILD]   (env: TREX_THREADS, default 2; DEMO_DIR to keep the run, default a
# temporary folder that is removed; DEMO_CPT_STEPS, DEMO_SFT_STEPS to change the length;
# DEMO_DATA=or trains on solver-verified OR data from `trex data or-gen` instead: its samples are
# 300-1500 tokens long, so the same number of steps takes far longer — see docs/train.md)
set -euo pipefail
build=${1:-build}
trex=$build/trex
py=/usr/bin/python3
export TREX_THREADS=${TREX_THREADS:-2}
cpt_steps=${DEMO_CPT_STEPS:-30}
sft_steps=${DEMO_SFT_STEPS:-200}
if [ -n "${DEMO_DIR:-}" ]; then
  work=$DEMO_DIR
  mkdir -p "$work"
  rm -rf "$work/cpt" "$work/sft" "$work/heldout" "$work/run-cpt" "$work/run-sft"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
start=$SECONDS

echo "== trex demo: post-training DeepSeek-V4 (dsv4-tiny) on $TREX_THREADS CPU threads =="
if [ "${DEMO_DATA:-demo}" = or ]; then
  "$trex" data or-gen --out "$work/or" --seed 1 --sft "${DEMO_OR_SFT:-120}" --cpt "${DEMO_OR_CPT:-60}" --quiet
  cpt_src=$work/or/cpt.jsonl sft_src=$work/or/sft.jsonl seq=${DEMO_SEQ:-2048} gbs=1 held=10
  prompts=("A factory makes chairs with profit 3 and tables with profit 5; at most 10 items in total. How many of each maximises profit?")
else
  cpt_src=data/demo/cpt.jsonl sft_src=data/demo/sft.jsonl seq=${DEMO_SEQ:-64} gbs=2 held=20
  prompts=("What is 7 plus 5?" "Reverse the word garden.")
fi
echo "== 1. corpus ($(dirname "$cpt_src")): $(wc -l <"$cpt_src") CPT documents, $(wc -l <"$sft_src") SFT samples; tokenizer"
cat "$cpt_src" "$sft_src" >"$work/all.jsonl"
"$trex" data train-tokenizer --vocab 4096 --in "$work/all.jsonl" --out "$work/tokenizer.json"
# dsv4-tiny with the tokenizer's vocabulary size (the model's vocab_size must cover every id)
vocab=$("$py" -c 'import json,sys; t=json.load(open(sys.argv[1])); print(1+max(list(t["model"]["vocab"].values())+[a["id"] for a in t["added_tokens"]]))' "$work/tokenizer.json")
"$py" -c 'import json,sys; c=json.load(open("configs/dsv4-tiny.json")); c["vocab_size"]=int(sys.argv[2]); json.dump(c,open(sys.argv[1],"w"),indent=1)' \
  "$work/dsv4-tiny-demo.json" "$vocab"
echo "demo config: configs/dsv4-tiny.json with vocab_size $vocab"

echo "== 2. token shards (sequences of $seq tokens)"
head -n "-$held" "$sft_src" >"$work/sft-train.jsonl"
tail -n "$held" "$sft_src" >"$work/sft-heldout.jsonl"
"$trex" data tokenize --tokenizer "$work/tokenizer.json" --format cpt --seq "$seq" --in "$cpt_src" --out "$work/cpt" --quiet
"$trex" data tokenize --tokenizer "$work/tokenizer.json" --format sft --seq "$seq" --in "$work/sft-train.jsonl" --out "$work/sft" --quiet
"$trex" data tokenize --tokenizer "$work/tokenizer.json" --format sft --seq "$seq" --in "$work/sft-heldout.jsonl" --out "$work/heldout" --quiet

# MFU denominator: the fp32 FMA peak of the threads used, measured now (trex bench peak; docs/mfu.md)
peak=$("$trex" bench peak --json --threads "$TREX_THREADS" --reps 3 --seconds 0.2 |
  "$py" -c 'import json,sys; print(json.load(sys.stdin)["peak_tflops"]["avx512_fp32_fma"]["all_threads"])' 2>/dev/null || echo 0)
echo "MFU peak: ${peak} TFLOP/s (trex bench peak, AVX-512 fp32 FMA, $TREX_THREADS threads; 0 = the cluster file's)"

echo "== 3a. continued pre-training: $cpt_steps steps from random weights"
"$trex" train --config "$work/dsv4-tiny-demo.json" --tokenizer "$work/tokenizer.json" --data "$work/cpt" \
  --out "$work/run-cpt" --steps "$cpt_steps" --seq "$seq" --gbs $((2 * gbs)) --mbs $((2 * gbs)) --optimizer adamw --lr 2e-3 --warmup $((cpt_steps / 6)) \
  --min-lr 5e-4 --expert-load-every 0 --seed 1 --peak-tflops "$peak"

echo "== 3b. SFT: $sft_steps steps from the CPT checkpoint, evaluated on $(wc -l <"$work/sft-heldout.jsonl") held-out samples"
"$trex" train --config "$work/dsv4-tiny-demo.json" --tokenizer "$work/tokenizer.json" --data "$work/sft" \
  --init "$work/run-cpt/step-$cpt_steps/model.safetensors" --eval-data "$work/heldout" --eval-every $(((sft_steps + 1) / 2)) \
  --out "$work/run-sft" --steps "$sft_steps" --seq "$seq" --gbs "$gbs" --mbs "$gbs" --optimizer adamw --lr 2e-3 --warmup $((sft_steps / 20)) \
  --min-lr 2e-4 --save-every $(((sft_steps + 1) / 2)) --keep 2 --seed 1 --peak-tflops "$peak"

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

echo "== 4. generation with the SFT checkpoint (greedy)"
for prompt in "${prompts[@]}"; do
  echo "prompt: $prompt"
  printf 'answer: '
  "$trex" generate --run "$work/run-sft" --prompt "$prompt" --max-new 32
done
echo "== demo done in $((SECONDS - start)) s"
