#!/usr/bin/env bash
# asan: yes
# tests/test_eval_or.sh — `trex eval or` (docs/or.md "Evaluation") on two sets of three eval rows: the
# test's own, always (`code` rows of `trex data or-gen`, solver-verified, turned into eval rows: the problem
# text as `question`, the verified objective as `answer`, the verified LP as `reference_lp`; or-evalcheck
# confirms each LP gives its answer), and the first three shared NL4Opt rows of ../shared/or/eval (or
# TREX_OR_EVAL_DIR) where they exist. A bare clone runs every check but the shared-row ones.
#   - scoring, through --answers (given texts instead of generations): on each row set, the reference LP of
#     a row scores 1 on both the LP and the final value; a wrong LP (another row's) and value score 0; a
#     garbled LP block counts as unparsable; the verified reference answers of or-gen rows score 100% in
#     every category;
#   - generation: a tiny run trained for 2 steps answers each set's 3 eval rows and 4 or-gen held-out rows;
#     the report has its table and counts, --out has one JSON object per row with the scored fields
#     (accuracy is near 0 here: that is expected of 2 steps, and not asserted);
#   - errors: missing run, run without a checkpoint, missing step, malformed row (named by line and id),
#     an answers file without a row's answer; the --out file is not created when the run fails.
# Env: TREX = the trex binary, PYTHON, TREX_OR_EVAL_DIR. Run from the repository root.
. "$(dirname "$0")/lib.sh"
EVAL=${TREX_OR_EVAL_DIR:-../shared/or/eval}
export TREX_THREADS=2

# --- eval rows ------------------------------------------------------------------------------------------------
"$TREX" data or-gen --out "$tmp/gen" --seed 7 --sft 12 --cpt 0 --quiet >/dev/null 2>&1 && ok || bad "or-gen"
"$TREX" data or-gen --out "$tmp/code" --seed 11 --sft 3 --cpt 0 --tasks code --quiet >/dev/null 2>&1 && ok ||
  bad "or-gen code rows"
"$PY" - "$tmp/code/sft.jsonl" "$tmp/own.jsonl" <<'PY' && ok || bad "own eval rows from or-gen code rows"
import json, sys
out = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    md = r["metadata"]
    if md["task"] != "code" or md["status"] != "optimal":
        continue
    ask = r["messages"][-2]["content"]        # the problem, a blank line, the request for an LP file
    lp = r["messages"][-1]["content"]         # the verified LP, in one ```lp fence
    assert lp.startswith("```lp\n") and lp.rstrip().endswith("```"), lp[:80]
    out.append({"id": "own/" + r["id"], "question": ask.rsplit("\n\n", 1)[0], "answer": md["objective"],
                "reference_lp": lp.strip()[len("```lp\n"):-3]})
assert len(out) == 3, f"{len(out)} optimal code rows, want 3"
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in out))
PY
"$TREX" data or-evalcheck --quiet "$tmp/own.jsonl" >"$tmp/evalcheck" 2>&1 && ok ||
  { bad "or-evalcheck of the own rows"; cat "$tmp/evalcheck"; }
sets=(own)
if [ -f "$EVAL/nl4opt_glpk.jsonl" ]; then
  head -3 "$EVAL/nl4opt_glpk.jsonl" >"$tmp/shared.jsonl"
  sets+=(shared)
else
  echo "note: no shared eval rows at $EVAL/nl4opt_glpk.jsonl (set TREX_OR_EVAL_DIR); the test's own rows only"
fi

# --- a tiny run -------------------------------------------------------------------------------------------
cat data/demo/cpt.jsonl data/demo/sft.jsonl >"$tmp/all.jsonl"
"$TREX" data train-tokenizer --vocab 1024 --in "$tmp/all.jsonl" --out "$tmp/tok.json" --quiet >/dev/null 2>&1 || bad "train-tokenizer"
head -16 data/demo/sft.jsonl >"$tmp/sft.jsonl"
"$TREX" data tokenize --tokenizer "$tmp/tok.json" --format sft --seq 64 --in "$tmp/sft.jsonl" --out "$tmp/sh" --quiet >/dev/null 2>&1 || bad "tokenize"
V=$("$PY" -c 'import json,sys; t=json.load(open(sys.argv[1])); print(1+max(list(t["model"]["vocab"].values())+[a["id"] for a in t["added_tokens"]]))' "$tmp/tok.json")
"$PY" - "$tmp" "$V" <<'PY'
import json, sys
d, V = sys.argv[1], int(sys.argv[2])
c = json.load(open("configs/dsv4-tiny.json"))
c.update(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_dim=32, qk_rope_head_dim=16,
         q_lora_rank=16, o_groups=2, o_lora_rank=16, sliding_window=16, compress_ratios=[0, 4, 0],
         index_n_heads=2, index_head_dim=32, index_topk=4, n_routed_experts=4, num_experts_per_tok=2,
         moe_intermediate_size=32, num_hash_layers=1)
json.dump(c, open(d + "/small.json", "w"), indent=1)
PY
"$TREX" train --config "$tmp/small.json" --data "$tmp/sh" --tokenizer "$tmp/tok.json" --steps 2 --gbs 2 --mbs 2 \
  --lr 2e-3 --warmup 1 --peak-tflops 0.02 --out "$tmp/R" >"$tmp/ot" 2>"$tmp/et" && ok || { bad "train"; cat "$tmp/et"; }

# --- each set of 3 eval rows: scoring through --answers, then generation ----------------------------------------
for s in "${sets[@]}"; do
  "$PY" - "$tmp/$s.jsonl" "$tmp/ans_$s.jsonl" <<'PY' || bad "$s: answers file"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
# row 1 is answered with row 2's LP: a model of another problem, wrong as long as the optima differ
a1, a2 = rows[1]["answer"], rows[2]["answer"]
assert abs(a2 - a1) > 1e-6 * max(1, abs(a1)), "rows 1 and 2 share an optimum"
with open(sys.argv[2], "w") as f:
    r = rows[0]   # the reference LP and the right value: 1 and 1
    f.write(json.dumps({"id": r["id"], "output": "The model:\n\n```lp\n" + r["reference_lp"] + "```\n\nOptimal objective value: %.12g" % r["answer"]}) + "\n")
    r = rows[1]   # another problem's LP, the value off by one: 0 and 0
    f.write(json.dumps({"id": r["id"], "output": "```lp\n" + rows[2]["reference_lp"] + "```\nOptimal objective value: %.12g" % (r["answer"] + 1)}) + "\n")
    r = rows[2]   # a garbled LP block and no value line: unparsable
    f.write(json.dumps({"id": r["id"], "output": "```lp\nMaximize\n obj: 3 x +* y\nSubject To\n c1: x <=\nEnd\n```\nSo x is big."}) + "\n")
PY
  "$TREX" eval or --set "$tmp/$s.jsonl" --answers "$tmp/ans_$s.jsonl" --out "$tmp/res_$s.jsonl" --quiet >"$tmp/o1" 2>"$tmp/e1" \
    && ok || { bad "$s: eval or --answers"; cat "$tmp/e1"; }
  expect_line "$tmp/o1" "^eval-lp +3 +1 +33\.3%$" "$s: LP accuracy 1 of 3"
  expect_line "$tmp/o1" "^eval-value +3 +1 +33\.3%$" "$s: value accuracy 1 of 3"
  expect_line "$tmp/o1" "^rows 3  unscored 0  unparsable 1  solver_failures 0  timeouts 0  truncated 0$" "$s: counts"
  "$PY" - "$tmp/res_$s.jsonl" <<'PY' && ok || bad "$s: per-row results of the oracle answers"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 3
assert r[0]["lp_correct"] and r[0]["value_correct"] and r[0]["lp_status"] == "optimal" and not r[0]["unparsable"], r[0]
assert not r[1]["lp_correct"] and not r[1]["value_correct"] and r[1]["lp"] == "parsed" and not r[1]["unparsable"], r[1]
assert r[2]["lp"] == "parse_error" and r[2]["unparsable"] and not r[2]["lp_correct"] and r[2]["value"] is None, r[2]
assert all(x["category"] == "eval" and "output" in x for x in r)
PY

  "$TREX" eval or --run "$tmp/R" --set "$tmp/$s.jsonl" --max-new 4 --out "$tmp/res_run_$s.jsonl" >"$tmp/o3" 2>"$tmp/e3" \
    && ok || { bad "$s: eval or --run"; cat "$tmp/e3"; }
  expect_line "$tmp/o3" "^trex eval or: set=.* max_new=4 " "$s: effective settings printed"
  expect_line "$tmp/o3" "^trex eval or: .*/R/step-2, 3 rows$" "$s: run and step named"
  expect_line "$tmp/o3" "^eval-lp +3 +[0-3] +[0-9.]+%$" "$s: LP accuracy line"
  expect_line "$tmp/o3" "^eval-value +3 +[0-3] +[0-9.]+%$" "$s: value accuracy line"
  expect_line "$tmp/o3" "^rows 3  unscored 0  unparsable [0-3]  solver_failures [0-3]  timeouts [0-3]  truncated [0-3]$" "$s: counts line"
  expect_line "$tmp/e3" "^trex eval or: 3/3 " "$s: progress lines"
  "$PY" - "$tmp/res_run_$s.jsonl" <<'PY' && ok || bad "$s: per-row results of generations"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 3
for x in r:
    for k in ("id", "line", "category", "reference", "lp", "lp_correct", "value", "value_correct", "unparsable",
              "new_tokens", "stopped_at_eos", "output"):
        assert k in x, (k, x)
    assert 1 <= x["new_tokens"] <= 4
PY
done

# --- or-gen rows: the verified reference answers score 100%; generation on 4 held-out rows ---------------------
"$PY" - "$tmp/gen/sft.jsonl" "$tmp/ans_gen.jsonl" <<'PY' || bad "answers file of the or-gen rows"
import json, sys
with open(sys.argv[2], "w") as f:
    for l in open(sys.argv[1]):
        r = json.loads(l)
        f.write(json.dumps({"id": r["id"], "output": r["messages"][-1]["content"]}) + "\n")
PY
"$TREX" eval or --set "$tmp/gen/sft.jsonl" --answers "$tmp/ans_gen.jsonl" --quiet >"$tmp/o2" 2>"$tmp/e2" \
  && ok || { bad "eval or --answers (or-gen rows)"; cat "$tmp/e2"; }
for c in formulate code solve analyze; do
  if grep -Eq "^$c " "$tmp/o2"; then expect_line "$tmp/o2" "^$c +([0-9]+) +\1 +100\.0%$" "reference answers score 100% on $c"; fi
done
expect_line "$tmp/o2" "^rows 12  unscored [0-9]+  unparsable 0  solver_failures 0  timeouts 0" "or-gen counts"
grep -E '"task": ?"(code|solve)"' "$tmp/gen/sft.jsonl" | head -4 >"$tmp/held.jsonl"
"$TREX" eval or --run "$tmp/R" --step 2 --set "$tmp/held.jsonl" --max-new 3 --temperature 0.8 --seed 3 --quiet \
  --out "$tmp/res_held.jsonl" >"$tmp/o4" 2>"$tmp/e4" && ok || { bad "eval or --run (or-gen rows)"; cat "$tmp/e4"; }
expect_line "$tmp/o4" "^(code|solve) +[1-4] +[0-4] +[0-9.]+%$" "per-category accuracy"
expect_line "$tmp/o4" "^rows 4  unscored 0  " "or-gen counts line"
[ "$(wc -l <"$tmp/res_held.jsonl")" -eq 4 ] && ok || bad "4 result rows"

# --- errors -----------------------------------------------------------------------------------------------
err_case "missing run" "no such run directory" "$TREX" eval or --run "$tmp/nope" --set "$tmp/own.jsonl"
mkdir -p "$tmp/E" && cp "$tmp/R/config.json" "$tmp/E/"
err_case "run without a checkpoint" "has no checkpoint" "$TREX" eval or --run "$tmp/E" --set "$tmp/own.jsonl"
err_case "missing step" "no checkpoint step-7" "$TREX" eval or --run "$tmp/R" --step 7 --set "$tmp/own.jsonl"
{ head -1 "$tmp/own.jsonl"; echo '{"id": "broken/1", "question": "Maximize x."}'; } >"$tmp/badrow.jsonl"
err_case "malformed row" "line 2 \(id broken/1\): malformed row" \
  "$TREX" eval or --run "$tmp/R" --set "$tmp/badrow.jsonl" --out "$tmp/never.jsonl"
[ ! -e "$tmp/never.jsonl" ] && ok || bad "no --out file after a failure"
{ head -1 "$tmp/own.jsonl"; echo 'not json'; } >"$tmp/badjson.jsonl"
err_case "row that is not JSON" "line 2: malformed row: not a JSON object" "$TREX" eval or --run "$tmp/R" --set "$tmp/badjson.jsonl"
head -1 "$tmp/ans_own.jsonl" >"$tmp/ans1.jsonl"
id2=$("$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[1])["id"])' "$tmp/own.jsonl")
err_case "answer missing" "has no answer for id $id2" \
  "$TREX" eval or --set "$tmp/own.jsonl" --answers "$tmp/ans1.jsonl"
err_case "no run, no answers" "give --run RUN" "$TREX" eval or --set "$tmp/own.jsonl"

finish
