#!/usr/bin/env bash
# Whole-model check of the C engine against the independent PyTorch reference (tests/ref/):
# logits, MTP logits, the 5 losses and every gradient, on random tiny models.
#   env TREX=build/trex PYTHON=/usr/bin/python3 bash tests/test_ref_compare.sh
# Checks: the reference's own self-checks, then one check per case:
#   make_case -> `$TREX model run ... --backward` -> dsv4_ref.py -> compare.py
# A case whose `trex model run` fails (e.g. not built yet) fails; nothing is skipped.
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.." || exit 1
export PYTHONDONTWRITEBYTECODE=1
REF=tests/ref

start=$SECONDS
if "$PY" $REF/selfcheck.py >"$tmp/selfcheck.log" 2>&1; then
  ok "ref-selfcheck ($(grep -E '^[0-9]+ passed' "$tmp/selfcheck.log"), $((SECONDS - start))s)"
else
  cat "$tmp/selfcheck.log"; bad "ref-selfcheck"
fi

# run_case NAME CONFIG SEED B T MODE [make_case flags...]
run_case() {
  local name=$1 cfg=$2 seed=$3 B=$4 T=$5 mode=$6; shift 6
  local d="$tmp/$name" t0=$SECONDS tc tr
  mkdir -p "$d"
  if [ ! -f "$cfg" ]; then bad "$name (config $cfg not found)"; return; fi
  if ! "$PY" $REF/make_case.py --config "$cfg" --seed "$seed" --B "$B" --T "$T" "$@" \
        --weights "$d/w.safetensors" --batch "$d/in.safetensors" >"$d/make.log" 2>&1; then
    cat "$d/make.log"; bad "$name (make_case failed)"; return
  fi
  t0=$SECONDS
  if ! "$TREX" model run --config "$cfg" --weights "$d/w.safetensors" --batch "$d/in.safetensors" \
        --out "$d/c.safetensors" --backward --indexer-mode "$mode" >"$d/c.log" 2>&1; then
    tail -n 20 "$d/c.log"; bad "$name ($TREX model run failed)"; return
  fi
  tc=$((SECONDS - t0)); t0=$SECONDS
  if ! "$PY" $REF/dsv4_ref.py --config "$cfg" --weights "$d/w.safetensors" --batch "$d/in.safetensors" \
        --out "$d/ref.safetensors" --backward --indexer-mode "$mode" >"$d/ref.log" 2>&1; then
    tail -n 20 "$d/ref.log"; bad "$name (reference failed)"; return
  fi
  tr=$((SECONDS - t0))
  cat "$d/ref.log"
  if "$PY" $REF/compare.py "$d/c.safetensors" "$d/ref.safetensors" --case "$name"; then
    ok "$name (trex ${tc}s, ref ${tr}s)"
  else
    bad "$name (trex ${tc}s, ref ${tr}s)"
  fi
}

# The configs of MODEL_SPEC §11.1.
TINY=configs/dsv4-tiny.json
STRICT=configs/dsv4-tiny-strict.json
# Seeds were picked so that no router / indexer top-k cut is a near tie (the reference prints the
# smallest gaps it saw: router_gap is absolute, index_rel_gap is relative to the row's largest score).
run_case tiny-T256        $TINY   5 2 256  dense
run_case tiny-T256-sparse $TINY   5 2 256  sparse
run_case tiny-T37         $TINY   3 1 37   dense
run_case tiny-packed      $TINY   8 2 256  dense  --packed --mask
run_case strict-T1024     $STRICT 7 1 1024 sparse

echo "ref-compare total $((SECONDS - start))s"
finish
