#!/usr/bin/env bash
# bench/plan_local_validate.sh — the planner against this machine (docs/perf.md, "Planner vs this
# machine"): predicted against measured step time and peak memory of trex's fp32 reference engine.
#
#   bench/plan_local_validate.sh [BUILD] [--calibrate] [--bench-seq T] [--no-bench] [--train] [--reps N]
#     BUILD        build directory with trex and libtrex.a (default: build)
#     --calibrate  first re-measure the rates (bench/plan_local.sh BUILD --write), right before the runs,
#                  so that the load factors describe the same conditions
#     --bench-seq  the dsv4-bench sequence length (default 512; 4096 takes ~25 min on the loaded box)
#     --no-bench   dsv4-tiny only (dsv4-bench needs 3.3 GiB of weights and ~8 GiB of memory at T=512)
#     --train      also `trex train` on dsv4-tiny (AdamW, gbs 2 = 2 micro-batches of 1 x 256): the
#                  median step time of steps 2.. against the planner's steady-state step
#     --reps N     model runs per dsv4-tiny case (default 3; the median is compared)
#
# For each case: `trex plan --explain` on configs/clusters/local.json gives the prediction of a
# `trex model run --backward --no-logits` pass (forward, backward, peak RSS); the run prints the
# measured ones. Prints one table row per case with the load average around it. Wall-clock times on a
# shared machine depend on the load: compare runs made under the load of the calibration.
set -euo pipefail
build=build
calibrate=0
bench_seq=512
bench=1
train=0
reps=3
while [ $# -gt 0 ]; do
  case $1 in
    --calibrate) calibrate=1 ;;
    --bench-seq) bench_seq=$2; shift ;;
    --no-bench) bench=0 ;;
    --train) train=1 ;;
    --reps) reps=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^set -euo/ { exit } NR > 1' "$0"; exit 0 ;;
    *) build=$1 ;;
  esac
  shift
done
trex=$build/trex
[ -x "$trex" ] || { echo "bench/plan_local_validate.sh: no $trex (make BUILD=$build)" >&2; exit 2; }
cluster=configs/clusters/local.json
threads=$(sed -n 's/.*"threads": *\([0-9]*\).*/\1/p' "$cluster" | head -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ "$calibrate" = 1 ] && bench/plan_local.sh "$build" --write >/dev/null

/usr/bin/python3 - "$work" <<'EOF'
import json, struct, sys
def save(path, B, T, V):
    vals = [(i * 2654435761 + 12345) % V for i in range(B * T)]
    b = struct.pack("<%di" % len(vals), *vals)
    h = json.dumps({"tokens": {"dtype": "I32", "shape": [B, T], "data_offsets": [0, len(b)]}}).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b)
d = sys.argv[1]
for B, T in ((1, 256), (2, 128), (1, 512)):
    save("%s/tiny-%dx%d.st" % (d, B, T), B, T, 4096)
for T in (256, 512, 1024, 2048, 4096):
    save("%s/bench-1x%d.st" % (d, T), 1, T, 129280)
EOF
"$trex" model init --config configs/dsv4-tiny.json --seed 1 --out "$work/tiny.st" >/dev/null

load() { cut -d' ' -f1 /proc/loadavg; }
printf '%-22s %-11s %10s %10s %10s %10s %10s %10s %8s %9s %9s %7s\n' case load pred_fwd pred_bwd \
  pred_tot meas_fwd meas_bwd meas_tot error pred_rss meas_rss error
# case NAME CONFIG WEIGHTS BATCH B T REPS
case_run() {
  local name=$1 cfg=$2 w=$3 batch=$4 B=$5 T=$6 n=$7
  "$trex" plan --model "$cfg" --cluster "$cluster" --devices 1 --seq "$T" --gbs "$B" --optimizer adamw \
    --layout "tp=1,pp=1,ep=1,cp=1,zero=0,recompute=none,mbs=$B" --explain >"$work/plan" 2>&1
  local pf pb pr
  pf=$(sed -n 's/^  time: forward \([0-9.]*\) s, backward \([0-9.]*\) s.*/\1/p' "$work/plan")
  pb=$(sed -n 's/^  time: forward \([0-9.]*\) s, backward \([0-9.]*\) s.*/\2/p' "$work/plan")
  pr=$(grep -A3 'as `trex model run' "$work/plan" | sed -n 's/.*memory: peak RSS \([0-9.]*\) MiB.*/\1/p')
  local l0 l1 i
  l0=$(load)
  : >"$work/meas"
  for i in $(seq "$n"); do
    "$trex" model run --config "$cfg" --weights "$w" --batch "$batch" --out "$work/out.st" --backward \
      --no-logits --threads "$threads" >"$work/run" 2>&1
    local f b r
    f=$(sed -n 's/^time: forward \([0-9.]*\) s, backward \([0-9.]*\) s.*/\1/p' "$work/run")
    b=$(sed -n 's/^time: forward \([0-9.]*\) s, backward \([0-9.]*\) s.*/\2/p' "$work/run")
    r=$(sed -n 's/^memory: peak RSS \([0-9.]*\) MiB.*/\1/p' "$work/run")
    echo "$f $b $r" >>"$work/meas"
  done
  l1=$(load)
  # the run with the median total
  read -r mf mb mr < <(awk '{ print $1 + $2, $0 }' "$work/meas" | sort -n | awk -v n="$n" 'NR == int((n + 1) / 2) { print $2, $3, $4 }')
  awk -v name="$name" -v l="$l0-$l1" -v pf="$pf" -v pb="$pb" -v mf="$mf" -v mb="$mb" -v pr="$pr" -v mr="$mr" \
    'BEGIN { printf "%-22s %-11s %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %+7.1f%% %9.1f %9.1f %+6.1f%%\n",
             name, l, pf, pb, pf + pb, mf, mb, mf + mb, 100 * ((pf + pb) / (mf + mb) - 1), pr, mr,
             100 * (pr / mr - 1) }'
}

case_run "dsv4-tiny 1x256" configs/dsv4-tiny.json "$work/tiny.st" "$work/tiny-1x256.st" 1 256 "$reps"
case_run "dsv4-tiny 2x128" configs/dsv4-tiny.json "$work/tiny.st" "$work/tiny-2x128.st" 2 128 "$reps"
case_run "dsv4-tiny 1x512" configs/dsv4-tiny.json "$work/tiny.st" "$work/tiny-1x512.st" 1 512 "$reps"
if [ "$bench" = 1 ]; then
  "$trex" model init --config configs/dsv4-bench.json --seed 1 --out "$work/bench.st" >/dev/null
  case_run "dsv4-bench 1x$bench_seq" configs/dsv4-bench.json "$work/bench.st" "$work/bench-1x$bench_seq.st" 1 \
    "$bench_seq" 1
  rm -f "$work/bench.st"
fi

if [ "$train" = 1 ]; then
  # tokenizer and CPT shards of the demo corpus at T = 256; AdamW, 2 micro-batches of 1 per step
  cat data/demo/cpt.jsonl data/demo/sft.jsonl >"$work/all.jsonl"
  "$trex" data train-tokenizer --vocab 4096 --in "$work/all.jsonl" --out "$work/tok.json" --quiet
  "$trex" data tokenize --tokenizer "$work/tok.json" --format cpt --seq 256 --in data/demo/cpt.jsonl \
    --out "$work/sh" --quiet >/dev/null
  l0=$(load)
  "$trex" train --config configs/dsv4-tiny.json --data "$work/sh" --tokenizer "$work/tok.json" --out "$work/trainrun" \
    --steps 6 --gbs 2 --mbs 1 --optimizer adamw --threads "$threads" --save-every 0 --keep 1 >"$work/train.log" 2>&1
  l1=$(load)
  "$trex" plan --model configs/dsv4-tiny.json --cluster "$cluster" --devices 1 --seq 256 --gbs 2 --optimizer adamw \
    --layout "tp=1,pp=1,ep=1,cp=1,zero=0,recompute=none,mbs=1" --explain >"$work/plan"
  /usr/bin/python3 - "$work/trainrun/metrics.jsonl" "$work/plan" "$l0-$l1" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["step_s"] for r in rows if r.get("step", 0) >= 2 and "step_s" in r]
rss = max(r.get("peak_rss_mib", 0) for r in rows)
plan = open(sys.argv[2]).read()
pred = float(re.search(r"step time ([0-9.]+) s", plan).group(1))
mem = float(re.search(r"memory per device ([0-9.]+) GiB", plan).group(1)) * 1024
meas = statistics.median(steps)
print("%-22s %-11s %10s %10s %10.3f %10s %10s %10.3f %+7.1f%% %9.1f %9.1f %+6.1f%%" % (
    "train tiny 2x(1x256)", sys.argv[3], "", "", pred, "", "", meas, 100 * (pred / meas - 1), mem, rss,
    100 * (mem / rss - 1)))
PY
fi
