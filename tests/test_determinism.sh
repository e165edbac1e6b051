#!/usr/bin/env bash
# tests/test_determinism.sh — `trex model run --backward` on dsv4-tiny gives byte-identical output files
# (logits, losses, every gradient) with 1 thread, 2 threads and TREX_THREADS=2, in dense and sparse
# mode, and with TREX_ISA=ref (the reference kernels) as at the best level; and bad batches and a bad
# TREX_ISA, and an --out that names an input, are refused with exit status 1 and a message (for a batch,
# naming the file and the tensor).
# Env: TREX (the trex binary, default build/trex), PYTHON (only to write the small batch files).
. "$(dirname "$0")/lib.sh"
CFG=configs/dsv4-tiny.json

# Batches written with the standard library only (safetensors: u64 header length, JSON, data).
"$PY" - "$tmp" <<'EOF' || { bad "cannot write the batch files"; finish; }
import sys
sys.path.insert(0, "tests/lib")
from tiny_batch import save, write_batch
out = sys.argv[1]
B, T, V, tok, doc, mask = write_batch(out)
badtok = list(tok); badtok[T + 7] = V
save(out + "/bad_token.safetensors", {"tokens": ("I32", [B, T], "i", badtok)})
save(out + "/bad_dtype.safetensors", {"tokens": ("I64", [B, T], "q", tok)})
save(out + "/short.safetensors", {"tokens": ("I32", [B, 1], "i", tok[:B])})
save(out + "/no_tokens.safetensors", {"doc_ids": ("I32", [B, T], "i", doc)})
save(out + "/bad_mask.safetensors", {"tokens": ("I32", [B, T], "i", tok), "loss_mask": ("U8", [B, T - 1], "B", mask[:B * (T - 1)])})
EOF

if ! "$TREX" model init --config "$CFG" --seed 3 --out "$tmp/w.safetensors" >/dev/null 2>"$tmp/init.err"; then
  cat "$tmp/init.err"; bad "model init"; finish
fi

run() {  # run OUT MODE [extra args...]; env passes through
  local out=$1 mode=$2; shift 2
  "$TREX" model run --config "$CFG" --weights "$tmp/w.safetensors" --batch "$tmp/batch.safetensors" \
    --out "$out" --backward --indexer-mode "$mode" "$@" >"$out.log" 2>&1
}

for mode in dense sparse; do
  if run "$tmp/$mode-t1.st" $mode --threads 1; then ok; else bad "$mode --threads 1: $(tail -n 3 "$tmp/$mode-t1.st.log")"; continue; fi
  if run "$tmp/$mode-t2.st" $mode --threads 2; then ok; else bad "$mode --threads 2"; continue; fi
  if TREX_THREADS=2 run "$tmp/$mode-env.st" $mode; then ok; else bad "$mode TREX_THREADS=2"; continue; fi
  grep -q "threads 2" "$tmp/$mode-env.st.log" && ok || bad "$mode: TREX_THREADS=2 was not used"
  cmp -s "$tmp/$mode-t1.st" "$tmp/$mode-t2.st" && ok || bad "$mode: --threads 1 and --threads 2 outputs differ"
  cmp -s "$tmp/$mode-t1.st" "$tmp/$mode-env.st" && ok || bad "$mode: --threads 1 and TREX_THREADS=2 outputs differ"
  grep -E "^loss " "$tmp/$mode-t1.st.log"
done
# fp32 mode gives the same bits at every kernel level (docs/precision.md): the reference kernels
# (TREX_ISA=ref) against this machine's best level, so tests/test_ref_compare.sh, which runs at the
# best level, holds for the reference kernels too
for mode in dense sparse; do
  [ -e "$tmp/$mode-t2.st" ] || continue
  if TREX_ISA=ref run "$tmp/$mode-ref.st" $mode --threads 2; then ok; else bad "$mode TREX_ISA=ref"; continue; fi
  grep -q "kernels ref" "$tmp/$mode-ref.st.log" && ok || bad "$mode: TREX_ISA=ref did not select ref"
  cmp -s "$tmp/$mode-t2.st" "$tmp/$mode-ref.st" && ok || bad "$mode: TREX_ISA=ref and the best level differ"
done
# the two modes differ (top-k prunes at T = 128: 32 compressed blocks, k = 16)
cmp -s "$tmp/dense-t1.st" "$tmp/sparse-t1.st" && bad "dense and sparse outputs are identical" || ok

expect_error() {  # expect_error BATCH PATTERN...
  local b=$1; shift
  "$TREX" model run --config "$CFG" --weights "$tmp/w.safetensors" --batch "$tmp/$b" --out "$tmp/x.st" \
    >"$tmp/err.out" 2>"$tmp/err.txt"
  local rc=$?
  if [ $rc -ne 1 ]; then bad "$b: exit status $rc, expected 1"; return; fi
  for p in "$@"; do
    grep -q -- "$p" "$tmp/err.txt" || { bad "$b: message lacks '$p': $(cat "$tmp/err.txt")"; return; }
  done
  [ ! -e "$tmp/x.st" ] || { bad "$b: an output file was written"; return; }
  ok
}
expect_error bad_token.safetensors "trex: error:" "bad_token.safetensors" "tokens" "4096" "\[1, 7\]"
expect_error bad_dtype.safetensors "trex: error:" "bad_dtype.safetensors" "tokens" "I32"
expect_error short.safetensors "trex: error:" "short.safetensors" "tokens" "T >= 2"
expect_error no_tokens.safetensors "trex: error:" "no_tokens.safetensors" "tokens"
expect_error bad_mask.safetensors "trex: error:" "bad_mask.safetensors" "loss_mask"
# --out naming an input file: refused, the input untouched
for which in weights batch; do
  f="$tmp/w.safetensors"; [ $which = batch ] && f="$tmp/batch.safetensors"
  sum0=$(cksum <"$f")
  "$TREX" model run --config "$CFG" --weights "$tmp/w.safetensors" --batch "$tmp/batch.safetensors" --out "$f" \
    >/dev/null 2>"$tmp/err.txt"; rc=$?
  [ $rc -eq 1 ] && grep -q -- "is the --$which file" "$tmp/err.txt" && [ "$(cksum <"$f")" = "$sum0" ] && ok \
    || bad "--out = --$which: exit $rc, $(head -c 200 "$tmp/err.txt")"
done
# a TREX_ISA that is no kernel level: the same kind of error, not an abort
TREX_ISA=avx3 expect_error batch.safetensors "trex: error:" "TREX_ISA='avx3' is not a kernel level"

finish
