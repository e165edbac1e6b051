#!/usr/bin/env bash
# tests/test_bench_kernels.sh — `trex bench kernels` on one small case and one packer path (one thread,
# one run each, short peak loops):
#   - --json gives the cases asked for, with positive FLOP rates, and says where the operands live
#     (huge_pages false by default, true with --huge-pages: operands in transparent huge pages);
#   - the .rows case (operands through row lists) is there beside its plain case, with the same FLOPs;
#   - head2.fwd.f32b (bf16 x fp32 values, trex_gemm_bf16_f32b) runs at avx2 and is absent at ref;
#   - two threads' CPU time is all counted (FLOPs per CPU-second not above the one-core peak); a --filter
#     that matches nothing fails with status 1;
#   - the text report names the page size; --help lists --huge-pages; a bad flag fails with status 2.
# Env: TREX = the trex binary. Run from the repository root.
. "$(dirname "$0")/lib.sh"
run=(bench kernels --threads 1 --reps 1 --quick --no-onednn --tokens 64)

# --- JSON: one GEMM case (q LoRA down-projection at 64 tokens) and one packer path, 4 KiB / 2 MiB pages -----
for mode in 4k huge; do
  extra=()
  [ $mode = huge ] && extra=(--huge-pages)
  for f in attn.wq_a.fwd pack.a.rows.bf16; do
    "$TREX" "${run[@]}" "${extra[@]}" --filter "$f" --json >"$tmp/$mode-$f.json" 2>"$tmp/err"; rc=$?
    [ $rc -eq 0 ] && ok || { bad "bench kernels $mode $f exit $rc: $(head -c 300 "$tmp/err")"; continue; }
    "$PY" - "$tmp/$mode-$f.json" "$mode" "$f" <<'PY' && ok || bad "bench kernels $mode $f: JSON check"
import json, sys
j = json.load(open(sys.argv[1]))
huge, f = sys.argv[2] == "huge", sys.argv[3]
assert j["huge_pages"] is huge, j["huge_pages"]
if f.startswith("pack."):
    p = j["packing"]
    assert len(p) == 1 and p[0]["name"] == f and p[0]["gbs_cycled"] > 0 and p[0]["gbs_one_operand"] > 0, p
    assert j["kernels"] == [], j["kernels"]
else:
    k = j["kernels"]
    assert len(k) >= 1 and all(f in c["name"] for c in k), [c["name"] for c in k]
    assert all(c["tflops"] > 0 and c["ms"] > 0 for c in k), k
PY
  done
done

# --- the row-list case: the experts' dW with both operands through row lists (64 tokens over 24 experts) -------
"$TREX" "${run[@]}" --filter experts.w1.bwd_dw --json >"$tmp/rows.json" 2>"$tmp/err" && ok || bad "rows case exit: $(head -c 300 "$tmp/err")"
"$PY" - "$tmp/rows.json" <<'PY' && ok || bad "bench kernels: the .rows case"
import json, sys
k = {c["name"]: c for c in json.load(open(sys.argv[1]))["kernels"]}
r, p = k["experts.w1.bwd_dw.rows"], k["experts.w1.bwd_dw"]
assert r["rows"] is True and p["rows"] is False, (r["rows"], p["rows"])
assert r["tflops"] > 0 and r["gflop"] == p["gflop"] and r["shape"] == p["shape"], (r, p)
PY

# --- bf16x2g1's logits on fp32 hn (head2.fwd.f32b, 64 rows here): a case of the FMA levels only --------------
"$TREX" "${run[@]}" --isa avx2 --filter head2.fwd.f32b --json >"$tmp/f32b.json" 2>"$tmp/err" \
  && ok || bad "f32b case exit: $(head -c 300 "$tmp/err")"
"$TREX" "${run[@]}" --isa ref --filter head2.fwd.f32b --json >"$tmp/f32b-ref.json" 2>"$tmp/err" \
  && ok || bad "f32b case at ref exit: $(head -c 300 "$tmp/err")"
"$PY" - "$tmp/f32b.json" "$tmp/f32b-ref.json" <<'PY' && ok || bad "bench kernels: the f32b case"
import json, sys
j = json.load(open(sys.argv[1]))
k = j["kernels"]
if j["level"] == "avx2":  # else the machine lacks AVX2 and --isa gave ref
    assert [c["name"] for c in k] == ["head2.fwd.f32b"] and k[0]["tflops"] > 0, k
    assert k[0]["shape"] == "129280x64x1024", k[0]["shape"]
    assert abs(k[0]["gflop"] - 2 * 129280 * 64 * 1024 / 1e9) < 1e-3 * k[0]["gflop"], k[0]["gflop"]
else:
    assert j["level"] == "ref" and k == [], (j["level"], k)
assert json.load(open(sys.argv[2]))["kernels"] == []  # ref multiplies bf16 values only
PY

# --- CPU time of a millisecond's product on two threads: every thread counted (the process clock missed a
# running worker's share, which put FLOPs per CPU-second near twice the one-core peak) -----------------------
"$TREX" bench kernels --threads 2 --reps 3 --quick --no-onednn --tokens 512 --filter attn.wo_b.fwd --json \
  >"$tmp/cpu.json" 2>"$tmp/err" && ok || bad "two-thread case exit: $(head -c 300 "$tmp/err")"
"$PY" - "$tmp/cpu.json" <<'PY' && ok || bad "bench kernels: FLOPs per CPU-second above the one-core peak"
import json, sys
j = json.load(open(sys.argv[1]))
for c in j["kernels"]:
    assert 0 < c["cpu_tflops"] <= 1.5 * j["core_peak_tflops_per_cpu_second"], (c["name"], c["cpu_tflops"])
PY

# --- a filter that matches nothing fails before anything is measured ------------------------------------
"$TREX" "${run[@]}" --filter nosuchcase >"$tmp/o" 2>"$tmp/e"; rc=$?
[ $rc -eq 1 ] && grep -q "matches no case" "$tmp/e" && ok || bad "unmatched filter -> exit $rc: $(head -c 200 "$tmp/e")"

# --- text report names the page size ------------------------------------------------------------------------
"$TREX" "${run[@]}" --huge-pages --filter pack.a.rows.bf16 >"$tmp/text" 2>&1 || bad "text report exit"
grep -q "operands in 2 MiB pages" "$tmp/text" && ok || bad "text report: no 'operands in 2 MiB pages' ($(head -c 300 "$tmp/text"))"

# --- help and bad flags -------------------------------------------------------------------------------------
"$TREX" bench kernels --help >"$tmp/help" 2>&1 && grep -q -- "--huge-pages" "$tmp/help" && ok || bad "--help lacks --huge-pages"
"$TREX" bench kernels --huge-pagez >"$tmp/o" 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] && grep -q "huge-pagez" "$tmp/e" && ok || bad "bad flag -> exit $rc, stderr: $(head -c 200 "$tmp/e")"

finish
