#!/usr/bin/env bash
# Packed == unpacked, end to end: SFT samples tokenized and packed into shards by `trex data tokenize`
# give, run as packed rows through `trex model run`, the same summed token losses (main and MTP) as
# each sample run alone. This checks that shards, document ids, loss masks and the model's document
# handling fit together (docs/formats.md, docs/model-conventions.md).
. "$(dirname "$0")/lib.sh"

head -n 16 data/demo/sft.jsonl > "$tmp/s.jsonl"
if ! "$TREX" data tokenize --tokenizer tests/tokenizer/fixture_dsv3.json --format sft --seq 128 \
        --in "$tmp/s.jsonl" --out "$tmp/sh" >"$tmp/tok.log" 2>&1; then
  bad "tokenize: $(tail -n 2 "$tmp/tok.log")"
fi
"$TREX" data shard-info "$tmp/sh" --dump 3 >"$tmp/dump.txt" 2>&1 || bad "shard-info failed"
"$TREX" model init --config configs/dsv4-tiny.json --seed 3 --out "$tmp/w.safetensors" >/dev/null 2>&1 ||
  bad "model init failed"

# Batches: each dumped sequence packed, and each of its documents with a target alone.
"$PY" - "$tmp" <<'PY' || bad "could not build the batches"
import sys, json
sys.path.insert(0, "tests/ref")
import numpy as np, st
work = sys.argv[1]
seqs = {}
for line in open(f"{work}/dump.txt"):
    if not line.startswith("seq "): continue
    head, vals = line.split(":", 1)
    _, i, kind = head.split()
    seqs.setdefault(int(i), {})[kind] = [int(v) for v in vals.split()]
plan = []
for i, s in sorted(seqs.items()):
    tok, mask, doc = (np.array(s[k], dtype=np.int64) for k in ("tokens", "mask", "docs"))
    st.save(f"{work}/p{i}.safetensors", {"tokens": tok.astype(np.int32)[None],
            "loss_mask": mask.astype(np.uint8)[None], "doc_ids": doc.astype(np.int32)[None]})
    alone = []
    for d in np.unique(doc):
        idx = np.nonzero(doc == d)[0]
        if len(idx) < 3 or mask[idx[1:]].sum() == 0: continue
        name = f"a{i}_{d}"
        st.save(f"{work}/{name}.safetensors", {"tokens": tok[idx].astype(np.int32)[None],
                "loss_mask": mask[idx].astype(np.uint8)[None]})
        alone.append(name)
    plan.append({"packed": f"p{i}", "alone": alone})
json.dump(plan, open(f"{work}/plan.json", "w"))
PY

run() {   # run NAME: forward only, losses into NAME.out.safetensors
  "$TREX" model run --config configs/dsv4-tiny.json --weights "$tmp/w.safetensors" \
      --batch "$tmp/$1.safetensors" --out "$tmp/$1.out.safetensors" --no-logits >"$tmp/$1.log" 2>&1 ||
    bad "model run $1: $(tail -n 1 "$tmp/$1.log")"
}
for name in $("$PY" -c "import json,sys; p=json.load(open(sys.argv[1])); print(' '.join([e['packed'] for e in p] + [a for e in p for a in e['alone']]))" "$tmp/plan.json"); do
  run "$name"
done

# Summed losses: loss_main (a mean) times its number of targets, counted by the rules of
# docs/model-conventions.md; the same for loss_mtp.
"$PY" - "$tmp" >"$tmp/cmp.txt" <<'PY'
import sys, json
sys.path.insert(0, "tests/ref")
import numpy as np, st
work = sys.argv[1]
def sums(name):
    b, _ = st.load(f"{work}/{name}.safetensors")
    o, _ = st.load(f"{work}/{name}.out.safetensors")
    tok = b["tokens"][0]; mask = b["loss_mask"][0]
    doc = b["doc_ids"][0] if "doc_ids" in b else np.zeros_like(tok)
    T = len(tok)
    nm = sum(1 for t in range(1, T) if mask[t] and doc[t] == doc[t - 1])
    nt = sum(1 for i in range(T - 2) if mask[i + 2] and doc[i] == doc[i + 1] == doc[i + 2])
    return float(o["loss_main"]) * nm, float(o["loss_mtp"]) * nt, nm, nt
for e in json.load(open(f"{work}/plan.json")):
    pm, pt, pn, ptn = sums(e["packed"])
    am = at = 0.0; an = atn = 0
    for a in e["alone"]:
        m, t, n, tn = sums(a); am += m; at += t; an += n; atn += tn
    print(e["packed"], len(e["alone"]), pn, an, ptn, atn, repr(pm), repr(am), repr(pt), repr(at))
PY
[ -s "$tmp/cmp.txt" ] || bad "no comparison was made"
while read -r name ndocs pn an ptn atn pm am pt at; do
  [ "$ndocs" -ge 2 ] && ok || bad "$name: only $ndocs documents with targets; the test needs packing"
  [ "$pn" = "$an" ] && [ "$ptn" = "$atn" ] && ok || bad "$name: target counts differ ($pn/$an, $ptn/$atn)"
  "$PY" -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(abs(a-b) > 2e-5*max(1,abs(b)))" "$pm" "$am" &&
    ok || bad "$name: summed main loss packed $pm vs alone $am"
  "$PY" -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(abs(a-b) > 2e-5*max(1,abs(b)))" "$pt" "$at" &&
    ok || bad "$name: summed MTP loss packed $pt vs alone $at"
  echo "$name: $ndocs documents, main $pm vs $am, mtp $pt vs $at"
done <"$tmp/cmp.txt"
finish
