#!/usr/bin/env bash
# bench/loss_curve.sh — does bf16 training track fp32? (issue 4 target: "bf16 training of dsv4-tiny
# tracks the fp32 loss curve within 1% over 300 steps"; docs/precision.md "Training in bf16")
#
# Trains dsv4-tiny (with the demo tokenizer's vocabulary) on the CPT part of the demo corpus
# (data/demo/cpt.jsonl, sequences of SEQ tokens), once per precision and seed, the runs of one seed
# identical in everything (data, order, initial weights, AdamW, peak lr LR (2e-3) with a warmup of
# STEPS/15 steps and a cosine decay to LR_MIN (LR/10: 2e-4)) except --precision fp32 / bf16, and
# compares the loss_main curves:
#   ma_p(s)   = mean of loss_main over steps s-W+1 .. s of run p (W = 10, s >= W)
#   rel(s)    = |ma_bf16(s) - ma_fp32(s)| / ma_fp32(s)
#   max_rel   = max over s of rel(s)            (the target: <= 0.01)
#   final_rel = rel(STEPS)                      (the last W steps)
#   mean_rel  = (mean of loss_main over all steps, bf16 - the same, fp32) / the same, fp32 (signed)
# and also the largest single-step relative difference, for information (single steps are noisy).
# With CONTROL=1 each seed also gets a control run "ctl": fp32 with --balance-weight 1.0001e-4 instead
# of 1e-4, compared with the fp32 run the same way (how far two fp32 trajectories drift apart after a
# tiny perturbation: the measure's noise floor). CONTROL=init runs instead "pin": fp32 from the seed's
# initial weights (trex model init) with every value multiplied by 1 + 2^-9 u, u uniform in [-1, 1) —
# a random perturbation of the size of one bf16 rounding, once, at the start; CONTROL=all runs both.
# BF16=0 leaves the bf16 runs out (fp32 and the control runs only: the noise floor of a setting,
# measured without looking at bf16; docs/precision.md round 3); it needs CONTROL other than 0. The
# fp32 and control runs are the same commands either way, so KEEP=1 reuses them when bf16 is added.
# With several SEEDS the script also reports, over the
# seeds, the mean of each per-seed figure (mean_rel with its standard error) and the same measures on
# the seed-mean curves (loss_main averaged over the seeds at each step, then the W-step means).
# Usage: bench/loss_curve.sh [BUILD]
#   env: STEPS (300), GBS (2), SEQ (64), SEEDS ("1"; e.g. "1 2 3"), CONTROL (0, 1, init or all),
#        LR (peak learning rate, 2e-3), LR_MIN (end of the cosine decay; LR/10, i.e. 2e-4 by default),
#        BF16 (1; 0: no bf16 runs, see above),
#        THREADS (threads per run, 1), JOBS (runs at a time, 2), WORK (keep the runs there; default a
#        temporary folder), KEEP (1: reuse a run in WORK made by the same command that finished).
#        Runs of different LR, GBS, ... need different WORK folders to be kept side by side.
# The defaults are the original measurement: seed 1, gbs 2, lr 2e-3 to 2e-4, fp32 and bf16 side by side.
set -euo pipefail
build=${1:-build}
trex=$build/trex
py=/usr/bin/python3
steps=${STEPS:-300}
gbs=${GBS:-2}
seq=${SEQ:-64}
seeds=${SEEDS:-1}
control=${CONTROL:-0}
threads=${THREADS:-1}
jobs_max=${JOBS:-2}
keep=${KEEP:-0}
bf16=${BF16:-1}
# LR and LR_MIN: plain decimal numbers (1e-3, 0.0005); LR_MIN defaults to LR/10 (2e-4 for the default).
num_re='^([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$'
lr=${LR:-2e-3}
[[ $lr =~ $num_re ]] || { echo "loss_curve: LR '$lr' is not a number (e.g. 2e-3, 0.0005)" >&2; exit 2; }
if [ -n "${LR_MIN:-}" ]; then
  lr_min=$LR_MIN
elif [ -z "${LR:-}" ]; then
  lr_min=2e-4
else
  lr_min=$(awk -v x="$lr" 'BEGIN { printf "%g", x / 10 }')
fi
[[ $lr_min =~ $num_re ]] || { echo "loss_curve: LR_MIN '$lr_min' is not a number (e.g. 2e-4, 0.00005)" >&2; exit 2; }
if ! awk -v a="$lr" -v b="$lr_min" 'BEGIN { exit !(a > 0 && b <= a) }'; then
  echo "loss_curve: LR must be > 0 and LR_MIN <= LR (LR $lr, LR_MIN $lr_min)" >&2
  exit 2
fi
for v in "$steps" "$gbs" "$seq" "$threads" "$jobs_max" $seeds; do
  case $v in
    '' | *[!0-9]*)
      echo "loss_curve: '$v' is not a non-negative integer (STEPS, GBS, SEQ, THREADS, JOBS, SEEDS)" >&2
      exit 2 ;;
  esac
done
case $control in
  0 | 1 | init | all) ;;
  *) echo "loss_curve: CONTROL must be 0, 1, init or all, not '$control'" >&2; exit 2 ;;
esac
[ -n "$seeds" ] || { echo "loss_curve: SEEDS is empty" >&2; exit 2; }
case $bf16 in
  1) ;;
  0) [ "$control" != 0 ] || { echo "loss_curve: BF16=0 needs CONTROL=1, init or all (nothing to compare)" >&2; exit 2; } ;;
  *) echo "loss_curve: BF16 must be 0 or 1, not '$bf16'" >&2; exit 2 ;;
esac
if [ "$gbs" -lt 1 ] || [ "$seq" -lt 1 ] || [ "$jobs_max" -lt 1 ]; then
  echo "loss_curve: GBS, SEQ and JOBS must be >= 1" >&2
  exit 2
fi
if [ "$steps" -lt 10 ]; then echo "loss_curve: STEPS must be >= 10 (the moving average is 10 steps)" >&2; exit 2; fi
[ -x "$trex" ] || { echo "loss_curve: $trex not found (build first, or pass the build folder)" >&2; exit 2; }
if [ -n "${WORK:-}" ]; then
  work=$WORK
  mkdir -p "$work"
  rm -rf "$work/cpt"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi

"$trex" data train-tokenizer --vocab 4096 --in data/demo/cpt.jsonl --out "$work/tokenizer.json" --quiet
vocab=$("$py" -c 'import json,sys; t=json.load(open(sys.argv[1])); print(1+max(list(t["model"]["vocab"].values())+[a["id"] for a in t["added_tokens"]]))' "$work/tokenizer.json")
"$py" -c 'import json,sys; c=json.load(open("configs/dsv4-tiny.json")); c["vocab_size"]=int(sys.argv[2]); json.dump(c,open(sys.argv[1],"w"),indent=1)' \
  "$work/dsv4-tiny-demo.json" "$vocab"
"$trex" data tokenize --tokenizer "$work/tokenizer.json" --format cpt --seq "$seq" --in data/demo/cpt.jsonl --out "$work/cpt" --quiet >/dev/null

kinds="fp32 bf16"
case $control in 1) kinds="fp32 bf16 ctl" ;; init) kinds="fp32 bf16 pin" ;; all) kinds="fp32 bf16 ctl pin" ;; esac
[ "$bf16" = 1 ] || kinds=${kinds/ bf16/}
# The "pin" control's initial weights: x -> x * (1 + 2^-9 u), u uniform in [-1, 1) from Python's
# random.Random(7), every F32 tensor of the safetensors file (I64 tensors copied).
cat >"$work/perturb.py" <<'PY'
import json, struct, sys, random
from array import array
src, dst = sys.argv[1], sys.argv[2]
eps = 2.0 ** -9
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
rng = random.Random(7)
for k in sorted(hdr, key=lambda k: hdr[k]["data_offsets"][0] if k != "__metadata__" else -1):
    v = hdr[k]
    if k == "__metadata__" or v["dtype"] != "F32":
        continue
    b, e = v["data_offsets"]
    a = array("f")
    a.frombytes(bytes(data[b:e]))
    r = rng.random
    for i in range(len(a)):
        a[i] = a[i] * (1.0 + eps * (2.0 * r() - 1.0))
    data[b:e] = a.tobytes()
open(dst, "wb").write(raw[:8 + n] + bytes(data))
PY
echo "loss_curve: dsv4-tiny (vocab $vocab), $steps steps of $gbs x $seq tokens, AdamW lr $lr (warmup $((steps / 15)),"\
" cosine to $lr_min), seed(s) $seeds, runs: $kinds, $threads thread(s) per run, $jobs_max at a time"

# One run: run-<seed>-<kind>, its command in run-<seed>-<kind>.cmd (for KEEP), its output in log-<seed>-<kind>.
run_one() {
  local seed=$1 kind=$2 name="$work/run-$1-$2" p=$2 extra=()
  case $kind in
    ctl) p=fp32; extra=(--balance-weight 1.0001e-4) ;;
    pin) p=fp32; extra=(--init "$work/init-$seed-pin.safetensors") ;;
  esac
  local cmd=("$trex" train --config "$work/dsv4-tiny-demo.json" --tokenizer "$work/tokenizer.json"
    --data "$work/cpt" --out "$name" --steps "$steps" --seq "$seq" --gbs "$gbs" --mbs "$gbs"
    --optimizer adamw --lr "$lr" --warmup $((steps / 15)) --min-lr "$lr_min" --expert-load-every 0 --keep 1
    --seed "$seed" --peak-tflops 1 --precision "$p" "${extra[@]}")
  if [ "$keep" = 1 ] && [ -f "$name.cmd" ] && [ "$(cat "$name.cmd")" = "THREADS=$threads ${cmd[*]}" ] &&
     [ -f "$name/metrics.jsonl" ] && [ "$(wc -l <"$name/metrics.jsonl")" -eq "$steps" ]; then
    echo "loss_curve: reusing $name"
    return 0
  fi
  rm -rf "$name" "$name.cmd"
  if [ "$kind" = pin ]; then
    "$trex" model init --config "$work/dsv4-tiny-demo.json" --seed "$seed" --out "$work/init-$seed.safetensors" \
      >"$work/log-$seed-$kind" 2>&1 || return 1
    "$py" "$work/perturb.py" "$work/init-$seed.safetensors" "$work/init-$seed-pin.safetensors" || return 1
    rm -f "$work/init-$seed.safetensors"
  fi
  TREX_THREADS=$threads "${cmd[@]}" >"$work/log-$seed-$kind" 2>&1 || return 1
  echo "THREADS=$threads ${cmd[*]}" >"$name.cmd"
}

fail=0
running=0
for seed in $seeds; do
  for kind in $kinds; do
    if [ "$running" -ge "$jobs_max" ]; then
      wait -n || fail=1
      running=$((running - 1))
    fi
    run_one "$seed" "$kind" &
    running=$((running + 1))
  done
done
while [ "$running" -gt 0 ]; do
  wait -n || fail=1
  running=$((running - 1))
done
if [ $fail -ne 0 ]; then
  tail -n 5 "$work"/log-*
  echo "loss_curve: a training run failed" >&2
  exit 1
fi

args=()
for seed in $seeds; do
  for kind in $kinds; do args+=("$seed:$kind:$work/run-$seed-$kind/metrics.jsonl"); done
done
"$py" - "${args[@]}" <<'PY'
import json, math, sys
W = 10
runs = {}
for a in sys.argv[1:]:
    seed, kind, path = a.split(":", 2)
    runs.setdefault(seed, {})[kind] = [json.loads(l) for l in open(path)]
seeds = list(runs)
kinds = list(runs[seeds[0]])
others = [k for k in kinds if k != "fp32"]   # bf16, and ctl with CONTROL=1
for s in seeds:
    steps0 = [r["step"] for r in runs[s]["fp32"]]
    for k in others:
        assert [r["step"] for r in runs[s][k]] == steps0, f"seed {s}: the runs have different steps"
assert len({len(runs[s]["fp32"]) for s in seeds}) == 1, "the seeds' runs have different lengths"

def ma(v, i): return sum(v[i - W + 1:i + 1]) / W
def compare(la, lb):
    n = len(la)
    rel = [(i + 1, abs(ma(lb, i) - ma(la, i)) / ma(la, i)) for i in range(W - 1, n)]
    worst = max(rel, key=lambda x: x[1])
    single = max(((i + 1, abs(lb[i] - la[i]) / la[i]) for i in range(n)), key=lambda x: x[1])
    mean_rel = (sum(lb) - sum(la)) / sum(la)
    return {"rel": rel, "max": worst[1], "max_step": worst[0], "final": rel[-1][1],
            "mean_rel": mean_rel, "single": single}
def loss(s, k): return [r["loss_main"] for r in runs[s][k]]
def mean_se(v):
    m = sum(v) / len(v)
    if len(v) < 2: return m, float("nan")
    return m, math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v))

single_default = len(seeds) == 1 and others == ["bf16"]
if single_default:
    # The original report (one seed, fp32 against bf16).
    s = seeds[0]
    la, lb = loss(s, "fp32"), loss(s, "bf16")
    n = len(la)
    c = compare(la, lb)
    a, b = runs[s]["fp32"], runs[s]["bf16"]
    print(f"steps {n}; loss_main fp32 {la[0]:.4f} -> {la[-1]:.4f}, bf16 {lb[0]:.4f} -> {lb[-1]:.4f}")
    print(f"{W}-step moving average at the end: fp32 {ma(la, n - 1):.5f}, bf16 {ma(lb, n - 1):.5f}")
    print(f"max_rel {c['max']:.5f} (step {c['max_step']}), final_rel {c['final']:.5f}, "
          f"largest single-step difference {c['single'][1]:.5f} (step {c['single'][0]})")
    print(f"mean_rel (mean loss_main over the run, bf16 vs fp32) {c['mean_rel']:+.5f}")
    for st in sorted({W, 50, 100, 150, 200, 250, n}):
        if W <= st <= n:
            print(f"  step {st:4d}: ma fp32 {ma(la, st - 1):.4f}  bf16 {ma(lb, st - 1):.4f}  rel {c['rel'][st - W][1]:.5f}")
    tps = [sum(r["tokens_per_s"] for r in x[1:]) / (n - 1) for x in (a, b)]
    print(f"mean tokens/s (for information; both runs shared the machine): fp32 {tps[0]:.0f}, bf16 {tps[1]:.0f}")
    print("target (max_rel <= 0.01):", "met" if c["max"] <= 0.01 else "NOT met")
    sys.exit(0)

n = len(loss(seeds[0], "fp32"))
print(f"steps {n}, seeds {' '.join(seeds)}; each line compares a run with the fp32 run of its seed "
      f"({W}-step means of loss_main; ctl = fp32 with balance weight x 1.0001; "
      f"pin = fp32 from initial weights x (1 + 2^-9 u))")
print(f"{'seed':>6} {'run':>4} {'max_rel':>8} {'(step)':>6} {'final_rel':>9} {'mean_rel':>9} {'fp32 mean':>9} {'end ma fp32':>11} {'end ma run':>10}")
per = {k: [] for k in others}
for s in seeds:
    la = loss(s, "fp32")
    for k in others:
        lb = loss(s, k)
        c = compare(la, lb)
        per[k].append(c)
        print(f"{s:>6} {k:>4} {c['max']:8.5f} {c['max_step']:6d} {c['final']:9.5f} {c['mean_rel']:+9.5f} "
              f"{sum(la) / n:9.5f} {ma(la, n - 1):11.5f} {ma(lb, n - 1):10.5f}")
print("over the seeds (mean of the per-seed figures; mean_rel: mean +- standard error):")
for k in others:
    m_max = sum(c["max"] for c in per[k]) / len(per[k])
    m_fin = sum(c["final"] for c in per[k]) / len(per[k])
    m, se = mean_se([c["mean_rel"] for c in per[k]])
    se_txt = f"{se:.5f}" if len(per[k]) > 1 else "n/a (one seed)"
    print(f"  {k}: max_rel {m_max:.5f}, final_rel {m_fin:.5f}, mean_rel {m:+.5f} +- {se_txt}")
print(f"seed-mean curves (loss_main averaged over the {len(seeds)} seeds at each step, then {W}-step means):")
avg = {k: [sum(loss(s, k)[i] for s in seeds) / len(seeds) for i in range(n)] for k in kinds}
cavg = {}
for k in others:
    c = cavg[k] = compare(avg["fp32"], avg[k])
    print(f"  {k}: max_rel {c['max']:.5f} (step {c['max_step']}), final_rel {c['final']:.5f}, mean_rel {c['mean_rel']:+.5f}")
hdr = "  ".join(f"ma {k} (rel)" for k in others)
print(f"  step   ma fp32  {hdr}")
for st in sorted({W, 25, 50, 100, 150, 200, 250, n}):
    if W <= st <= n:
        cols = "  ".join(f"{ma(avg[k], st - 1):.4f} ({cavg[k]['rel'][st - W][1]:.4f})" for k in others)
        print(f"  {st:4d}   {ma(avg['fp32'], st - 1):.4f}  {cols}")
fa = avg["fp32"]
print(f"fp32 seed-mean curve: {W}-step mean {ma(fa, W - 1):.4f} at step {W}, {ma(fa, n - 1):.4f} at step {n} "
      f"(down {100 * (1 - ma(fa, n - 1) / ma(fa, W - 1)):.1f}%)")
for k in others:
    if k != "bf16":
        print(f"noise floor ({k} vs fp32, max_rel of the seed-mean curves): {cavg[k]['max']:.5f}; "
              f"round-3 rule (< 0.005): {'below' if cavg[k]['max'] < 0.005 else 'NOT below'}")
if "bf16" in cavg:
    print("target (max_rel of the seed-mean curves <= 0.01):", "met" if cavg["bf16"]["max"] <= 0.01 else "NOT met")
PY
