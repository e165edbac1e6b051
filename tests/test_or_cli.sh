#!/usr/bin/env bash
# tests/test_or_cli.sh — `trex data or-*` end to end: or-evalcheck on the shared eval rows, or-gen of a few
# hundred samples verified 100% by or-verify, byte-identical output for 1 and 3 workers, manifest
# invariants, or-stats, and the failure paths (malformed eval row, tampered sample, bad flags).
# Needs TREX (the trex binary). The shared eval rows are read from ../shared/or/eval (or TREX_OR_EVAL_DIR)
# where they exist; otherwise or-evalcheck runs on the test's own three rows.
. "$(dirname "$0")/lib.sh"

# 1. eval rows: the shared eval rows (../shared/or/eval, or TREX_OR_EVAL_DIR) where they are; without
#    them (a clone with nothing beside it) the test's own rows, so or-evalcheck's pass still runs
EVAL=${TREX_OR_EVAL_DIR:-../shared/or/eval}
if [ -f "$EVAL/b4o_feasible_glpk.jsonl" ] && [ -f "$EVAL/nl4opt_glpk.jsonl" ]; then
  rows=("$EVAL"/b4o_feasible_glpk.jsonl "$EVAL"/nl4opt_glpk.jsonl)
else
  echo "note: no shared eval rows at $EVAL; or-evalcheck runs on this test's own rows"
  printf '%s\n' '{"id":"own/1","reference_lp":"Minimize\n obj: x\nSubject To\n c: x >= 2\nEnd\n","answer":2}' \
    '{"id":"own/2","reference_lp":"Maximize\n obj: 3 x + 2 y\nSubject To\n c1: x + y <= 4\n c2: x + 3 y <= 6\nBounds\n x <= 3\nEnd\n","answer":11}' \
    '{"id":"own/3","reference_lp":"Maximize\n obj: x + y\nSubject To\n c: 2 x + 2 y <= 5\nGeneral\n x y\nEnd\n","answer":2}' \
    >"$tmp/own.jsonl"
  rows=("$tmp/own.jsonl")
fi
if "$TREX" data or-evalcheck --quiet "${rows[@]}" >"$tmp/eval.log" 2>&1; then
  ok
else
  bad "or-evalcheck: $(grep -E 'FAIL|passed' "$tmp/eval.log" | head -5)"
fi
grep -q "or-evalcheck: [1-9][0-9]* passed, 0 failed" "$tmp/eval.log" && ok || bad "or-evalcheck summary: $(tail -1 "$tmp/eval.log")"

# 2. a malformed eval row is reported with its id and fails the run
printf '%s\n' '{"id":"bad/1","reference_lp":"Minimize\n obj: x[\nEnd\n","answer":1}' \
  '{"id":"bad/2","reference_lp":"Minimize\n obj: x\nSubject To\n c: x >= 2\nEnd\n","answer":3}' \
  '{"id":"good/3","reference_lp":"Minimize\n obj: x\nSubject To\n c: x >= 2\nEnd\n","answer":2}' \
  '{"reference_lp":"x"}' >"$tmp/bad.jsonl"
if "$TREX" data or-evalcheck "$tmp/bad.jsonl" >"$tmp/bad.log" 2>&1; then bad "or-evalcheck accepted bad rows"; else ok; fi
grep -q "FAIL bad/1" "$tmp/bad.log" && grep -q "FAIL bad/2" "$tmp/bad.log" && grep -q "ok   good/3" "$tmp/bad.log" \
  && grep -q "FAIL line 4" "$tmp/bad.log" && ok || bad "bad eval rows not reported by id: $(cat "$tmp/bad.log")"

# 3. or-gen + or-verify (100%)
if "$TREX" data or-gen --quiet --seed 5 --sft 200 --cpt 200 --workers 2 --out "$tmp/g2" 2>"$tmp/gen.log"; then ok; else bad "or-gen failed: $(tail -3 "$tmp/gen.log")"; fi
[ "$(wc -l <"$tmp/g2/sft.jsonl")" = 200 ] && [ "$(wc -l <"$tmp/g2/cpt.jsonl")" = 200 ] && ok || bad "or-gen line counts"
if "$TREX" data or-verify --quiet "$tmp/g2/sft.jsonl" "$tmp/g2/cpt.jsonl" >"$tmp/ver.log" 2>&1; then ok; else bad "or-verify: $(grep REJECT "$tmp/ver.log" | head -5)"; fi
grep -q "or-verify: 400 passed, 0 failed" "$tmp/ver.log" && ok || bad "or-verify summary: $(tail -1 "$tmp/ver.log")"
ls -a "$tmp/g2" | grep -q -e '\.tmp' -e 'or-gen-tmp' && bad "temporary files left behind" || ok

# 4. determinism across worker counts
"$TREX" data or-gen --quiet --seed 5 --sft 40 --cpt 30 --workers 1 --out "$tmp/w1" 2>/dev/null
"$TREX" data or-gen --quiet --seed 5 --sft 40 --cpt 30 --workers 3 --out "$tmp/w3" 2>/dev/null
for f in sft.jsonl cpt.jsonl manifest.json; do cmp -s "$tmp/w1/$f" "$tmp/w3/$f" && ok || bad "$f differs between 1 and 3 workers"; done
"$TREX" data or-gen --quiet --seed 6 --sft 40 --cpt 30 --workers 2 --out "$tmp/w6" 2>/dev/null
cmp -s "$tmp/w1/sft.jsonl" "$tmp/w6/sft.jsonl" && bad "different seeds gave the same output" || ok

# 5. manifest invariants and row schema
if "$PY" - "$tmp/g2" <<'PYEOF'
import json, sys
d = sys.argv[1]
m = json.load(open(d + "/manifest.json"))
errs = []
for kind, n, by in (("sft", 200, "by_task"), ("cpt", 200, "by_doc_type")):
    k = m[kind]
    if sum(k[by].values()) != n: errs.append(kind + " " + by + " sum")
    if sum(k["by_family"].values()) != n: errs.append(kind + " family sum")
    f = k["funnel"]
    # every attempt ends written or rejected (run-level rejections are counted once, like the others)
    if f["attempted"] != f["written"] + f["rejected_total"]:
        errs.append(kind + " funnel does not add up")
    fams = k["by_family"].values()
    if kind == "sft" and max(fams) - min(fams) > 1: errs.append("sft families unbalanced")
want = {"formulate": 50, "code": 50, "solve": 60, "analyze": 40}
if m["sft"]["by_task"] != want: errs.append("task shares %s" % m["sft"]["by_task"])
for line in open(d + "/sft.jsonl"):
    r = json.loads(line); md = r["metadata"]
    for key in ("task", "family", "objective", "status"):
        if key not in md: errs.append("missing " + key)
    roles = [x["role"] for x in r["messages"]]
    if roles != ["system", "user", "assistant"]: errs.append("roles %s" % roles)
    a = r["messages"][-1]["content"]
    if md["task"] == "code" and (a.count("```lp") != 1 or not a.startswith("```lp")): errs.append("code fence")
    if md["task"] == "solve" and not a.rstrip("\n").split("\n")[-1].startswith("Optimal objective value: "): errs.append("solve last line")
    if (md["objective"] is None) != (md["status"] != "optimal"): errs.append("objective/status")
for line in open(d + "/cpt.jsonl"):
    r = json.loads(line)
    if len(r["text"]) < 400: errs.append("short cpt")
if errs: print("\n".join(errs[:10]))
sys.exit(1 if errs else 0)
PYEOF
then ok; else bad "manifest/row invariants"; fi

# 6. a tampered sample is rejected by or-verify
"$PY" - "$tmp/g2/sft.jsonl" "$tmp/tampered.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = []
for r in rows:
    if r["metadata"]["task"] == "solve":
        r["metadata"]["objective"] = r["metadata"]["objective"] + 1
        out.append(r); break
for r in rows:
    if r["metadata"]["task"] == "code":
        r["messages"][-1]["content"] = r["messages"][-1]["content"].replace(" <= ", " >= ", 1)
        out.append(r); break
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in out))
PYEOF
if "$TREX" data or-verify --quiet "$tmp/tampered.jsonl" >"$tmp/t.log" 2>&1; then bad "tampered samples accepted"; else ok; fi
[ "$(grep -c REJECT "$tmp/t.log")" = 2 ] && ok || bad "expected 2 rejections: $(cat "$tmp/t.log")"

# 7. a killed run leaves no partial output under the final names
"$TREX" data or-gen --quiet --seed 8 --sft 3000 --cpt 3000 --workers 2 --out "$tmp/killed" 2>/dev/null &
gpid=$!
sleep 1
exec 3>&2 2>/dev/null   # keep bash's "Killed" job notice out of the log
kill -9 "$gpid"
wait "$gpid"
sleep 0.5
exec 2>&3 3>&-
[ ! -e "$tmp/killed/sft.jsonl" ] && [ ! -e "$tmp/killed/cpt.jsonl" ] && [ ! -e "$tmp/killed/manifest.json" ] && ok \
  || bad "a killed or-gen left output files"
pgrep -f "or-gen --quiet --seed 8 --sft 3000" >/dev/null && bad "workers outlived a killed or-gen" || ok

# 8. restrictions (--tasks, --families, --max-chars): only the named tasks and families, every SFT sample
#    within the bound, the bound's rejections in the funnel, worker-count independence, or-verify 100%
R="--quiet --seed 9 --sft 24 --cpt 6 --tasks code,solve --families knapsack,diet,max_flow --max-chars 2800 --no-system"
"$TREX" data or-gen $R --workers 1 --out "$tmp/r1" 2>"$tmp/r.log" || bad "restricted or-gen failed: $(tail -3 "$tmp/r.log")"
"$TREX" data or-gen $R --workers 3 --out "$tmp/r3" 2>/dev/null
for f in sft.jsonl cpt.jsonl manifest.json; do cmp -s "$tmp/r1/$f" "$tmp/r3/$f" && ok || bad "restricted $f differs between 1 and 3 workers"; done
if "$PY" - "$tmp/r1" <<'PYEOF'
import json, sys
d = sys.argv[1]
m = json.load(open(d + "/manifest.json"))
errs = []
fams = {"knapsack", "diet", "max_flow"}
rows = [json.loads(l) for l in open(d + "/sft.jsonl")]
for r in rows:
    md = r["metadata"]
    if md["task"] not in ("code", "solve"): errs.append("task " + md["task"])
    if md["family"] not in fams: errs.append("family " + md["family"])
    n = sum(len(x["content"].encode()) for x in r["messages"])
    if n > 2800: errs.append("sample of %d characters" % n)
    if [x["role"] for x in r["messages"]] != ["user", "assistant"]: errs.append("roles")
for l in open(d + "/cpt.jsonl"):
    if json.loads(l)["metadata"]["family"] not in fams: errs.append("cpt family")
if m["sft"]["by_task"] != {"code": 11, "solve": 13}: errs.append("task split %s" % m["sft"]["by_task"])
if sorted(m["sft"]["by_family"].values()) != [8, 8, 8]: errs.append("families %s" % m["sft"]["by_family"])
f = m["sft"]["funnel"]
if f["rejected"].get("OVER_MAX_CHARS", 0) < 1: errs.append("no OVER_MAX_CHARS rejections: %s" % f)
if f["attempted"] != f["written"] + f["rejected_total"]: errs.append("funnel does not add up")
c = m["config"]
if c.get("max_sft_chars") != 2800 or c["families"] != ["diet", "knapsack", "max_flow"] or c["task_share"]["formulate"] != 0:
    errs.append("config %s" % c)
if errs: print("\n".join(errs[:10]))
sys.exit(1 if errs else 0)
PYEOF
then ok; else bad "restricted output"; fi
"$TREX" data or-verify --quiet "$tmp/r1/sft.jsonl" "$tmp/r1/cpt.jsonl" 2>&1 | grep -q "or-verify: 30 passed, 0 failed" && ok \
  || bad "or-verify of the restricted output"
"$TREX" data or-gen --quiet --sft 4 --tasks code,nope --out "$tmp/x1" >"$tmp/x.log" 2>&1; rc=$?
[ $rc = 1 ] && grep -q 'unknown name "nope"' "$tmp/x.log" && grep -q "formulate,code,solve,analyze" "$tmp/x.log" && [ ! -e "$tmp/x1" ] && ok \
  || bad "unknown --tasks name: exit $rc, $(cat "$tmp/x.log")"
"$TREX" data or-gen --quiet --sft 4 --families knapsack,knapsack --out "$tmp/x2" >"$tmp/x.log" 2>&1; rc=$?
[ $rc = 1 ] && grep -q 'repeated name "knapsack"' "$tmp/x.log" && ok || bad "repeated --families name: exit $rc, $(cat "$tmp/x.log")"
"$TREX" data or-gen --quiet --sft 2 --tasks code --families knapsack --max-chars 300 --out "$tmp/x3" >"$tmp/x.log" 2>&1; rc=$?
[ $rc = 1 ] && grep -q "could not be filled.*--max-chars" "$tmp/x.log" && [ ! -e "$tmp/x3/sft.jsonl" ] && ok \
  || bad "an unreachable --max-chars: exit $rc, $(cat "$tmp/x.log")"

# 9. or-stats and bad flags
"$TREX" data or-stats "$tmp/g2" >"$tmp/stats.md" 2>&1 && grep -q "| formulate | 50 |" "$tmp/stats.md" && ok || bad "or-stats"
"$TREX" data or-gen --sft 10 >/dev/null 2>&1; [ $? = 2 ] && ok || bad "missing --out is not a usage error"
"$TREX" data or-gen --sft -1 --out "$tmp/x" >/dev/null 2>&1; [ $? = 1 ] && ok || bad "negative --sft accepted"
"$TREX" data nope >/dev/null 2>&1; [ $? = 2 ] && ok || bad "unknown subcommand"
"$TREX" data or-stats "$tmp/missing" >/dev/null 2>&1; [ $? = 1 ] && ok || bad "or-stats on a missing folder"

finish
