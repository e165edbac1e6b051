#!/usr/bin/env bash
# tests/test_bench_fused.sh — `trex bench fused` at a small size (64 tokens, one thread, one run):
#   - --json lists every case once, with positive times and rates, the rate being the case's bytes over
#     its time, and the level asked for;
#   - at --isa ref the level is the reference, timed once: every speed-up is exactly 1;
#   - --filter keeps the matching cases, and one that matches nothing fails with status 1;
#   - the text report has its header and one line per case; --help explains the columns; bad values of
#     --tokens and --reps and an unknown flag fail with status 2.
# Env: TREX = the trex binary. Run from the repository root.
. "$(dirname "$0")/lib.sh"
run=(bench fused --threads 1 --reps 1 --tokens 64)
cases="rmsnorm.fwd rmsnorm.bwd rmsnorm.dw sumsq rope rms_head_bwd swiglu.fwd swiglu.bwd mhc.post_fwd mhc.post_bwd
mhc.collapse mhc.collapse_bwd pool.fwd pool.bwd ce.fwd ce.grad cvt_bf16_nt copy_nt adamw"

# --- JSON: every case at the machine's level and at ref ------------------------------------------------------
for isa in best ref; do
  extra=()
  [ $isa = ref ] && extra=(--isa ref)
  "$TREX" "${run[@]}" "${extra[@]}" --json >"$tmp/$isa.json" 2>"$tmp/err"; rc=$?
  [ $rc -eq 0 ] && ok || { bad "bench fused $isa exit $rc: $(head -c 300 "$tmp/err")"; continue; }
  "$PY" - "$tmp/$isa.json" "$isa" "$cases" <<'PY' && ok || bad "bench fused $isa: JSON check"
import json, sys
j = json.load(open(sys.argv[1]))
isa, want = sys.argv[2], sys.argv[3].split()
names = [c["name"] for c in j["cases"]]
assert names == want, names
assert j["tokens"] == 64 and j["threads"] == 1 and j["copy_gbs"] > 0, j
if isa == "ref":
    assert j["level"] == "ref", j["level"]
for c in j["cases"]:
    assert c["ms"] > 0 and c["ref_ms"] > 0 and c["gbs"] > 0 and c["mbytes"] > 0, c
    assert abs(c["gbs"] - c["mbytes"] / c["ms"]) <= 1e-6 * c["gbs"], c  # MB/ms = GB/s
    assert abs(c["pct_copy_bw"] - 100 * c["gbs"] / j["copy_gbs"]) <= 1e-6 * c["pct_copy_bw"], c
    if isa == "ref":
        assert c["speedup_vs_ref"] == 1 and c["ms"] == c["ref_ms"], c
PY
done

# --- --filter ---------------------------------------------------------------------------------------------------
"$TREX" "${run[@]}" --filter mhc. --json >"$tmp/f.json" 2>"$tmp/err" && ok || bad "filter exit: $(head -c 300 "$tmp/err")"
"$PY" - "$tmp/f.json" <<'PY' && ok || bad "bench fused --filter mhc.: the mHC cases only"
import json, sys
names = [c["name"] for c in json.load(open(sys.argv[1]))["cases"]]
assert names == ["mhc.post_fwd", "mhc.post_bwd", "mhc.collapse", "mhc.collapse_bwd"], names
PY
"$TREX" "${run[@]}" --filter nosuchcase >"$tmp/o" 2>"$tmp/e"; rc=$?
[ $rc -eq 1 ] && grep -q "matches no case" "$tmp/e" && ok || bad "unmatched filter -> exit $rc: $(head -c 200 "$tmp/e")"

# --- text report -------------------------------------------------------------------------------------------------
"$TREX" "${run[@]}" >"$tmp/text" 2>&1 && ok || bad "text report exit"
grep -q "^trex bench fused: .*copy bandwidth" "$tmp/text" && grep -q "^case .*%copy .*x ref" "$tmp/text" && ok \
  || bad "text report header: $(head -c 300 "$tmp/text")"
[ "$(grep -c -E '^(rmsnorm|sumsq|rope|rms_head|swiglu|mhc|pool|ce|cvt|copy|adamw)' "$tmp/text")" -eq 19 ] && ok \
  || bad "text report: not 19 case lines"

# --- help and bad values -------------------------------------------------------------------------------------
"$TREX" bench fused --help >"$tmp/help" 2>&1 && grep -q "copy bandwidth" "$tmp/help" && grep -q -- "--tokens" "$tmp/help" \
  && ok || bad "--help lacks the copy bandwidth or --tokens"
"$TREX" bench --help | grep -q "fused" && ok || bad "trex bench --help does not list fused"
for a in "--tokens 2" "--tokens 70000" "--reps 0" "--tokenz 5"; do
  # shellcheck disable=SC2086
  "$TREX" bench fused $a >"$tmp/o" 2>"$tmp/e"; rc=$?
  [ $rc -eq 2 ] && [ -s "$tmp/e" ] && ok || bad "bench fused $a -> exit $rc, stderr: $(head -c 200 "$tmp/e")"
done

finish
