#!/usr/bin/env bash
# tests/test_bench_step.sh — `trex bench step` on dsv4-tiny (T=64, 1 warm-up + 1 timed step):
#   - --json has the interface fields (tokens_per_s, mfu, peak_flops, model_flops_per_token, step_s) and
#     the others (peak_rss_mib, ops, config, seq, mbs, precision, threads, memory_mib), consistent:
#     mfu = tokens_per_s * model_flops_per_token / peak_flops, tokens_per_s * step_s = seq * mbs,
#     the op classes' seconds sum to the mean step time with every class but "other" inside it, the
#     classes the step runs were called, the peak given by --peak-tflops is the one used;
#   - model_flops_per_token is the planner's convention (docs/mfu.md): the figure `trex plan` prints;
#   - --no-weight-copies drops the bf16 weight copies (params region, same losses), fp32 never has them;
#   - --gemm-profile lists the bf16 products by shape (JSON array gemm, a text table): FLOPs = 2 M N K per
#     call, the sums, the LM head's logits product among them, no bit of the step changed;
#   - fp32 and bf16, AdamW and Muon run; the text report has its lines; the peak is measured when not
#     given (when the kernel level has a peak loop; a bf16 step at avx2 or avx512f takes the fp32 FMA loop's);
#   - bad flags fail with exit status 2 and a message naming the flag; a bad config with status 1.
# Env: TREX = the trex binary. Run from the repository root.
. "$(dirname "$0")/lib.sh"
export TREX_THREADS=2
cfg=configs/dsv4-tiny.json
fast=(--config "$cfg" --seq 64 --mbs 1 --steps 1 --warmup 1)

# --- JSON, bf16, given peak ------------------------------------------------------------------------------
"$TREX" bench step "${fast[@]}" --precision bf16 --peak-tflops 1.5 --json >"$tmp/bf16.json" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "bench step bf16 exit $rc"; cat "$tmp/err"; }
# --- JSON, fp32, Muon, measured peak ----------------------------------------------------------------------
# (one step only: Muon's Newton-Schulz takes seconds per step even on dsv4-tiny)
"$TREX" bench step --config "$cfg" --seq 64 --mbs 1 --steps 1 --warmup 0 --optimizer muon --json >"$tmp/muon.json" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "bench step fp32 muon exit $rc"; cat "$tmp/err"; }

"$PY" - "$tmp/bf16.json" "$tmp/muon.json" <<'PY' && ok || bad "JSON fields and their relations"
import json, math, sys
a = json.load(open(sys.argv[1]))
m = json.load(open(sys.argv[2]))
need = ["tokens_per_s", "mfu", "peak_flops", "model_flops_per_token", "step_s", "peak_rss_mib", "ops", "config",
        "seq", "mbs", "precision", "threads", "memory_mib"]
for r in (a, m):
    missing = [k for k in need if k not in r]
    assert not missing, f"missing {missing}"
    assert r["config"] == "configs/dsv4-tiny.json" and r["seq"] == 64 and r["mbs"] == 1 and r["threads"] == 2
    assert r["step_s"] > 0 and r["tokens_per_s"] > 0 and r["model_flops_per_token"] > 0
    # only an AMX_EMU test build emulates, and only the amx level
    assert r["kernels_emulated"] in (False, True) and (not r["kernels_emulated"] or r["kernels"] == "amx")
    assert abs(r["tokens_per_s"] * r["step_s"] - 64) < 1e-9 * 64, "tokens_per_s * step_s = seq * mbs"
    if r["peak_flops"] is not None:
        want = r["tokens_per_s"] * r["model_flops_per_token"] / r["peak_flops"]
        assert abs(r["mfu"] - want) <= 1e-12 + 1e-9 * want, f"mfu {r['mfu']} vs {want}"
    ops = r["ops"]
    classes = ["embed", "attention", "moe", "mhc", "head", "mtp", "optimizer", "other"]
    assert sorted(ops) == sorted(classes), ops
    assert all(v >= 0 for v in ops.values())
    inside = sum(v for k, v in ops.items() if k != "other")
    assert inside <= r["step_mean_s"] * (1 + 1e-9), f"classes {inside} > step {r['step_mean_s']}"
    assert abs(sum(ops.values()) - r["step_mean_s"]) <= 1e-9 + 1e-6 * r["step_mean_s"]
    cpu = r["ops_cpu"]
    assert sorted(cpu) == sorted(classes) and all(v >= 0 for v in cpu.values())
    assert sum(v for k, v in cpu.items() if k != "other") <= r["step_cpu_mean_s"] * (1 + 1e-9) + 1e-6
    calls = r["ops_calls"]
    for k in ("embed", "attention", "moe", "mhc", "head", "mtp", "optimizer"):
        assert calls[k] > 0, f"class {k} never timed"
    # 6 blocks + the MTP block, forward and backward: 14 attention and 14 MoE sub-layers per step
    assert calls["attention"] == 14 and calls["moe"] == 14, calls
    mem = r["memory_mib"]
    assert mem["params"] > 0 and mem["grads"] > 0 and mem["optimizer"] > 0 and mem["activations"] > 0
    assert r["peak_rss_mib"] >= mem["params"] + mem["grads"] + mem["optimizer"]
    assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
assert a["precision"] == "bf16" and m["precision"] == "fp32"
assert a["peak_flops"] == 1.5e12 and a["peak_source"] == "--peak-tflops"
assert a["optimizer"] == "adamw" and m["optimizer"] == "muon"
assert a["optimizer_flops_per_step"] == 0 and m["optimizer_flops_per_step"] > 0, "Newton-Schulz only under Muon"
assert a["model_flops_per_token"] == m["model_flops_per_token"], "FLOPs/token do not depend on the optimizer"
if m["kernels"] != "ref":
    want = "avx2_fp32_fma" if m["kernels"] == "avx2" else "avx512_fp32_fma"
    assert m["peak_source"] == want and m["peak_flops"] > 0, "fp32 peak measured"
PY

# --- the levels without a bf16 unit (avx2; avx512f, AVX-512 without AVX512_BF16): a bf16 step's MFU is
# against the level's fp32 FMA peak, the unit its bf16 products run on -------------------------------------
for isa in avx2 avx512f; do
    TREX_ISA=$isa "$TREX" bench step "${fast[@]}" --precision bf16 --json >"$tmp/$isa.json" 2>"$tmp/err"; rc=$?
    [ $rc -eq 0 ] && ok || { bad "bench step bf16 at $isa exit $rc"; cat "$tmp/err"; }
    "$PY" - "$tmp/$isa.json" "$isa" <<'PY' && ok || bad "$isa bf16 step: the peak and MFU"
import json, sys
r, isa = json.load(open(sys.argv[1])), sys.argv[2]
if r["kernels"] == isa:  # a machine with the level (else a lower one)
    want = "avx2_fp32_fma" if isa == "avx2" else "avx512_fp32_fma"
    assert r["peak_source"] == want and r["peak_flops"] > 0, (r["peak_source"], r["peak_flops"])
    assert r["mfu"] is not None and 0 < r["mfu"] < 1, r["mfu"]
PY
done

# --- --no-weight-copies: the same bf16 step without the bf16 weight copies (their memory, same losses) --------
"$TREX" bench step "${fast[@]}" --precision bf16 --peak-tflops 1.5 --no-weight-copies --json >"$tmp/nowc.json" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "bench step --no-weight-copies exit $rc"; cat "$tmp/err"; }
"$PY" - "$tmp/bf16.json" "$tmp/nowc.json" "$tmp/muon.json" <<'PY' && ok || bad "weight copies: in bf16 only, ~4 bytes per expert and projection weight (packed panels), same losses"
import json, sys
a, n, m = (json.load(open(f)) for f in sys.argv[1:4])
assert a["weight_copies"] is True and n["weight_copies"] is False and m["weight_copies"] is False
# dsv4-tiny: params ~= grads without copies; the copies (packed panels of both products under the default
# --recompute none: docs/params.md) add the fp32 bytes (and padding) of the experts (~69% of the weights)
# and of the attention's and indexer's projections except wo_a (78% in all, measured)
assert abs(n["memory_mib"]["params"] - n["memory_mib"]["grads"]) < 1, n["memory_mib"]
assert abs(m["memory_mib"]["params"] - m["memory_mib"]["grads"]) < 1, "fp32 mode never keeps copies"
extra = a["memory_mib"]["params"] - n["memory_mib"]["params"]
assert 0.74 * a["memory_mib"]["grads"] < extra < 0.9 * a["memory_mib"]["grads"], extra
assert (a["loss_first"], a["loss_last"]) == (n["loss_first"], n["loss_last"]), "the copies change no bit"
PY
# --recompute attention keeps the copies as rows (~2 bytes per expert weight): the same losses
"$TREX" bench step "${fast[@]}" --precision bf16 --peak-tflops 1.5 --recompute attention --json >"$tmp/att.json" \
  2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "bench step --recompute attention exit $rc"; cat "$tmp/err"; }
"$PY" - "$tmp/bf16.json" "$tmp/nowc.json" "$tmp/att.json" <<'PY' && ok || bad "weight copies as rows under --recompute attention"
import json, sys
a, n, t = (json.load(open(f)) for f in sys.argv[1:4])
extra = t["memory_mib"]["params"] - n["memory_mib"]["params"]
assert t["weight_copies"] is True and 0.25 * t["memory_mib"]["grads"] < extra < 0.5 * t["memory_mib"]["grads"], extra
assert (a["weight_copies_layout"], t["weight_copies_layout"], n["weight_copies_layout"]) == ("panels", "rows", None)
assert (t["loss_first"], t["loss_last"]) == (a["loss_first"], a["loss_last"]), "policy and layout change no bit"
PY

# --- --gemm-profile: the products by shape --------------------------------------------------------------
"$TREX" bench step "${fast[@]}" --precision bf16 --peak-tflops 1.5 --gemm-profile --json >"$tmp/gemm.json" \
  2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok || { bad "bench step --gemm-profile exit $rc"; cat "$tmp/err"; }
"$PY" - "$tmp/bf16.json" "$tmp/gemm.json" <<'PY' && ok || bad "--gemm-profile: shapes, FLOPs, sums, the head's product"
import json, sys
a, g = (json.load(open(f)) for f in sys.argv[1:3])
assert "gemm" not in a and "gemm_s" not in a, "only with --gemm-profile"
rows = g["gemm"]
assert rows, "no product recorded"
for r in rows:
    assert r["groups"] >= 1 and r["m"] >= 1 and r["n"] >= 1 and r["k"] >= 1 and r["calls"] > 0, r
    assert r["seconds"] >= 0 and r["flops"] > 0, r
    if r["groups"] == 1:
        want = 2.0 * r["m"] * r["n"] * r["k"] * r["calls"]
        assert abs(r["flops"] - want) <= 1e-9 * want, (r, want)
assert [r["seconds"] for r in rows] == sorted((r["seconds"] for r in rows), reverse=True), "slowest first"
assert abs(sum(r["seconds"] for r in rows) - g["gemm_s"]) <= 1e-9 + 1e-9 * g["gemm_s"]
assert abs(sum(r["flops"] for r in rows) - g["gemm_flops"]) <= 1e-6 * g["gemm_flops"]
assert 0 < g["gemm_s"] <= g["step_mean_s"], (g["gemm_s"], g["step_mean_s"])
# by op class: they sum to gemm_s, each inside its class's time
byc = g["gemm_ops"]
assert sorted(byc) == sorted(g["ops"]), byc
assert abs(sum(byc.values()) - g["gemm_s"]) <= 1e-9 + 1e-9 * g["gemm_s"], (byc, g["gemm_s"])
for k, v in byc.items():
    assert 0 <= v <= g["ops"][k] + 1e-6, (k, v, g["ops"][k])
assert byc["head"] > 0 and byc["attention"] > 0 and byc["moe"] > 0, byc
# dsv4-tiny (V 4096, d 256), bf16 head (bf16x2g1): logits^T [V, rows] = W3 [V, 2d] hnF^T, one per chunk;
# at the FMA levels W_hi spread against hn's fp32 values, K = d (trex_gemm_bf16_f32b)
k, lay = (256, "nt bf16 x f32 exact") if g["kernels"] in ("avx2", "avx512f") else (512, "nt bf16 x bf16")
head = [r for r in rows if r["m"] == 4096 and r["k"] == k and r["groups"] == 1 and r["layout"] == lay]
assert head, (g["kernels"], [(r["m"], r["n"], r["k"], r["layout"]) for r in rows])
assert (g["loss_first"], g["loss_last"]) == (a["loss_first"], a["loss_last"]), "profiling changes no bit"
PY

# --- model FLOPs per token = the planner's (trex plan prints it with 3 significant digits) ----------------
"$TREX" plan --model "$cfg" --cluster configs/clusters/local.json --devices 1 --gbs 1 --seq 64 --optimizer adamw \
  --top 1 >"$tmp/plan" 2>&1 || bad "trex plan"
"$PY" - "$tmp/bf16.json" "$tmp/plan" <<'PY' && ok || bad "model_flops_per_token equals trex plan's FLOPs/token"
import json, re, sys
f = json.load(open(sys.argv[1]))["model_flops_per_token"]
text = open(sys.argv[2]).read()
p = float(re.search(r"([0-9.e+]+) FLOPs/token", text).group(1))
assert float(f"{f:.3g}") == p, f"bench {f:.6g} vs plan {p}"
PY

# --- text report ------------------------------------------------------------------------------------------
"$TREX" bench step "${fast[@]}" --peak-tflops 1 >"$tmp/text" 2>&1 || bad "text report exit"
for pat in "^trex bench step: dsv4-tiny, seq 64, mbs 1, precision fp32" "^tokens/s +[0-9.]+" "^MFU +[0-9.]+%" \
           "^step +median [0-9.]+ s" "^  attention +[0-9.]+ s" "^  optimizer +[0-9.]+ s" "^memory +peak RSS [0-9]+ MiB"; do
  grep -Eq -- "$pat" "$tmp/text" && ok || { bad "text report: no line /$pat/"; cat "$tmp/text"; }
done
# bf16: the header names the layout of the experts' weight copies
"$TREX" bench step "${fast[@]}" --peak-tflops 1 --precision bf16 --recompute attention \
  >"$tmp/text16" 2>&1 || bad "bf16 text report exit"
grep -Eq -- "^trex bench step: dsv4-tiny, seq 64, mbs 1, precision bf16 \(expert weight copies as rows\)" \
  "$tmp/text16" && ok || { bad "bf16 text report: no weight-copies layout"; head -3 "$tmp/text16"; }
"$TREX" bench step "${fast[@]}" --peak-tflops 1 --precision bf16 --gemm-profile >"$tmp/textg" 2>&1 \
  || bad "--gemm-profile text report exit"
for pat in "^matrix products \(bf16 GEMM\) per step: [0-9.]+ s wall" "^ +M +N +K +groups +layout +calls" \
           "^  by op class \(wall s, TFLOP/s\): .*attention [0-9.]+ \([0-9.]+\).* head [0-9.]+" \
           "^ +4096 +[0-9]+ +(512 +1 +nt bf16 x bf16|256 +1 +nt bf16 x f32 exact) "; do
  grep -Eq -- "$pat" "$tmp/textg" && ok || { bad "--gemm-profile text: no line /$pat/"; cat "$tmp/textg"; }
done

# --- bad input --------------------------------------------------------------------------------------------
expect_err() { # expect_err STATUS PATTERN ARGS...
  local want=$1 pat=$2; shift 2
  "$TREX" bench step "$@" >"$tmp/o" 2>"$tmp/e"; local rc=$?
  if [ $rc -eq "$want" ] && grep -Eq -- "$pat" "$tmp/e"; then ok; else bad "bench step $* -> exit $rc (want $want), stderr: $(head -c 300 "$tmp/e")"; fi
}
expect_err 2 "precision 'fp16'.*fp32 or bf16" "${fast[@]}" --precision fp16
expect_err 2 "optimizer 'sgd'" "${fast[@]}" --optimizer sgd
expect_err 2 "--seq 1: must be" --config "$cfg" --seq 1
expect_err 2 "--steps 0: must be" "${fast[@]}" --steps 0
expect_err 2 "--mbs 0: must be" --config "$cfg" --seq 64 --mbs 0
expect_err 2 "--warmup -1: must be" "${fast[@]}" --warmup -1
expect_err 2 "--peak-tflops" "${fast[@]}" --peak-tflops -1
expect_err 2 "seq" --config "$cfg"
expect_err 2 "--threads.*whole number" "${fast[@]}" --threads abc
expect_err 1 "--config" --config "$tmp/missing.json" --seq 64

finish
