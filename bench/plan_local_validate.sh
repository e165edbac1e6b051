#!/usr/bin/env bash
# bench/plan_local_validate.sh — the planner against this machine (docs/perf.md, "Planner vs this
# machine"): predicted against measured step time and peak memory of trex's fp32 reference engine.
#
#   bench/plan_local_validate.sh [BUILD] [--no-calibrate] [--write] [--no-bench] [--bench-seq T]
#                                [--only-bench] [--steps N] [--reps N] [--no-first-pass]
#     BUILD           build directory with trex and libtrex.a (default: build)
#     --no-calibrate  use configs/clusters/local.json as it is (default: re-measure the rates with
#                     bench/plan_local.sh BUILD --out TMP right before the runs, into a temporary copy)
#     --write         keep the fresh rates: calibrate into configs/clusters/local.json itself
#     --no-bench      dsv4-tiny only (dsv4-bench needs ~15 GiB for a training step at T = 512; its run
#                     is wrapped in `flock /tmp/trex-big.lock`, and ended after its last step, before the
#                     final checkpoint)
#     --only-bench    dsv4-bench only
#     --bench-seq T   dsv4-bench's sequence length (default 512)
#     --steps N       optimizer steps of the dsv4-tiny training runs (default 6; dsv4-bench: 2, one
#                     step of ~50 CPU-seconds after the first, ~15 GiB, under the lock)
#     --reps N        model runs per first-pass dsv4-tiny case (default 3; the median is compared)
#     --no-first-pass skip the first-pass `trex model run` rows
#
# Two comparisons.
#  1. Steady-state training step, one thread (the issue's step time): `trex train --threads 1`, AdamW,
#     gbs = mbs, on the demo corpus, against `trex plan` on the cluster with fp32_ref.threads = 1. The
#     measured wall step is the median of step_s over steps 2..N (step 1 pays the page faults of the
#     arena and the gradients, which a steady-state step does not); the measured CPU step is the median
#     over the same steps of the process's CPU time (user + sys, all threads, /proc/PID/task/*/schedstat)
#     between the appearances of consecutive metrics.jsonl lines (the poller steps.py below checks
#     every 5 ms). Predicted: the planner's steady-state step (wall = CPU time / the
#     serial_share of the calibration) and its CPU time (fp32_engine.cpu_step_s). One thread because a
#     single thread's CPU time barely depends on the other jobs (a pool's wall time does: its threads
#     wait for each other), and the CPU-time comparison is the model's own accuracy, while the wall one
#     is also the load's stability between calibration and run ("share" = the run's CPU / wall).
#  2. First pass (`trex model run --backward --no-logits`, the cluster's threads) for dsv4-tiny: peak
#     RSS and arena accounting (deterministic: tests/test_plan_local.sh checks them) and the first-pass
#     time including page faults.
# Prints one row per case with the load average around it. No timing here is a test.
set -euo pipefail
build=build
calibrate=1
write=0
bench_seq=512
bench=1
tiny=1
steps=6
reps=3
first=1
while [ $# -gt 0 ]; do
  case $1 in
    --no-calibrate) calibrate=0 ;;
    --calibrate) calibrate=1 ;;
    --write) write=1 ;;
    --bench-seq) bench_seq=$2; shift ;;
    --no-bench) bench=0 ;;
    --only-bench) tiny=0 ;;
    --steps) steps=$2; shift ;;
    --reps) reps=$2; shift ;;
    --no-first-pass) first=0 ;;
    -h|--help) awk 'NR > 1 && /^set -euo/ { exit } NR > 1' "$0"; exit 0 ;;
    -*) echo "bench/plan_local_validate.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
trex=$build/trex
[ -x "$trex" ] || { echo "bench/plan_local_validate.sh: no $trex (make BUILD=$build)" >&2; exit 2; }
[ "$steps" -ge 2 ] || { echo "bench/plan_local_validate.sh: --steps must be >= 2" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }

cluster=configs/clusters/local.json
if [ "$calibrate" = 1 ]; then
  if [ "$write" = 1 ]; then
    bench/plan_local.sh "$build" --write >"$work/calib.log" 2>&1
  else
    bench/plan_local.sh "$build" --out "$work/local.json" >"$work/calib.log" 2>&1
    cluster=$work/local.json
  fi
  echo "calibrated: $(grep -o 'measured by bench/plan_local.sh on [^;]*' "$cluster")"
fi
threads=$(sed -n 's/.*"threads": *\([0-9]*\).*/\1/p' "$cluster" | head -n 1)
# the same rates, one thread
/usr/bin/python3 - "$cluster" "$work/local1.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["fp32_ref"]["threads"] = 1
json.dump(c, open(sys.argv[2], "w"), indent=2)
print("rates: serial_share %.3f, speedup %.3f (%d threads)" % (c["fp32_ref"]["serial_share"], c["fp32_ref"]["speedup"],
      json.load(open(sys.argv[1]))["fp32_ref"]["threads"]))
PY

# the per-step CPU-time poller (python; run as steps.py METRICS OUT.json [--stop-after N] -- COMMAND...)
cat >"$work/steps.py" <<'PYSTEPS'
"""steps.py (written by bench/plan_local_validate.sh) — runs a `trex train` command and measures the CPU time of each step.

    steps.py METRICS OUT.json [--stop-after N] -- trex train ... --out RUN ...
                                                     (METRICS = RUN/metrics.jsonl)

Every 5 ms it reads the process's CPU time (user + sys of all its threads: the first field of
/proc/PID/task/*/schedstat, nanoseconds on the CPU) and the size of METRICS; when a new line appears
(trex train writes and flushes one per step), the CPU time since the previous line is that step's.
Also the sys part of each step from /proc/PID/stat (10 ms ticks).
Writes {"steps": [{"step", "step_s", "cpu_s", "sys_s", "peak_rss_mib"}...], "load_before", "load_after"} to
OUT.json and exits with the command's status. --stop-after N ends the command (SIGTERM) once N lines
are there, before its final checkpoint (gigabytes for dsv4-bench), and then exits 0.
"""
import json
import os
import signal
import subprocess
import sys
import time


def cpu_ns(pid):
    total = 0
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, t)) as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        return None
    return total


def user_sys(pid):
    """user and sys seconds of the whole process (clock ticks: 10 ms resolution)"""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick
    except (OSError, ValueError, IndexError):
        return None


def main():
    args = sys.argv[1:]
    stop_after = 0
    if len(args) > 3 and args[2] == "--stop-after":
        stop_after = int(args[3])
        del args[2:4]
    if len(args) < 4 or args[2] != "--":
        sys.exit("usage: steps.py METRICS OUT.json [--stop-after N] -- COMMAND...")
    metrics, out, cmd = args[0], args[1], args[3:]
    load0 = float(open("/proc/loadavg").read().split()[0])
    proc = subprocess.Popen(cmd)
    marks = []          # CPU ns when each line was seen
    seen = 0
    size = -1
    last_cpu = 0
    last_us = (0.0, 0.0)
    marks_us = []
    while True:
        c = cpu_ns(proc.pid)
        if c is not None:
            last_cpu = c
        us = user_sys(proc.pid)
        if us is not None:
            last_us = us
        try:
            sz = os.path.getsize(metrics)
        except OSError:
            sz = -1
        if sz != size and sz > 0:
            size = sz
            with open(metrics) as f:
                n = sum(1 for line in f if line.strip())
            while seen < n:
                marks.append(last_cpu)
                marks_us.append(last_us)
                seen += 1
        if proc.poll() is not None:
            break
        if stop_after and seen >= stop_after:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            break
        time.sleep(0.005)
    load1 = float(open("/proc/loadavg").read().split()[0])
    rows = []
    try:
        with open(metrics) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except OSError:
        lines = []
    # the CPU time before the first step (start-up, data) is not known exactly: step 1 is measured from
    # the process start and so includes it; steps 2.. are exact to the polling interval
    prev = 0
    prev_sys = 0.0
    for i, r in enumerate(lines[:len(marks)]):
        rows.append({"step": r.get("step", i + 1), "step_s": r.get("step_s", 0.0),
                     "cpu_s": (marks[i] - prev) / 1e9, "sys_s": marks_us[i][1] - prev_sys,
                     "peak_rss_mib": r.get("peak_rss_mib", 0.0)})
        prev = marks[i]
        prev_sys = marks_us[i][1]
    json.dump({"steps": rows, "load_before": load0, "load_after": load1}, open(out, "w"), indent=1)
    sys.exit(0 if stop_after and seen >= stop_after else proc.returncode)


if __name__ == "__main__":
    main()
PYSTEPS

# ---- 1. steady-state training, one thread ----
cat data/demo/cpt.jsonl data/demo/sft.jsonl >"$work/all.jsonl"
"$trex" data train-tokenizer --vocab 4096 --in "$work/all.jsonl" --out "$work/tok.json" --quiet
printf '\n%-24s %-9s %8s %8s %7s %8s %8s %7s %6s %6s %9s %9s %7s\n' "steady step, 1 thread" load pred_s \
  meas_s error pred_cpu meas_cpu error share calib pred_rss meas_rss error
# train_case NAME CONFIG SEQ GBS STEPS LOCK
train_case() {
  local name=$1 cfg=$2 T=$3 gbs=$4 n=$5 lock=$6
  [ -d "$work/sh$T" ] || "$trex" data tokenize --tokenizer "$work/tok.json" --format cpt --seq "$T" \
    --in data/demo/cpt.jsonl --out "$work/sh$T" --quiet >/dev/null 2>&1
  "$trex" plan --model "$cfg" --cluster "$work/local1.json" --devices 1 --seq "$T" --gbs "$gbs" --optimizer adamw \
    --layout "tp=1,pp=1,ep=1,cp=1,zero=0,recompute=none,mbs=$gbs" --explain --json >"$work/plan.json"
  rm -rf "$work/run"
  $lock /usr/bin/python3 "$work/steps.py" "$work/run/metrics.jsonl" "$work/steps.json" --stop-after "$n" -- \
    "$trex" train --config "$cfg" --data "$work/sh$T" --tokenizer "$work/tok.json" --out "$work/run" --steps "$n" \
    --gbs "$gbs" --mbs "$gbs" --optimizer adamw --threads 1 --save-every 0 --keep 1 --seed 1 >"$work/train.log" 2>&1 ||
    { echo "$name: trex train failed:"; tail -n 5 "$work/train.log"; return 1; }
  rm -rf "$work/run"
  /usr/bin/python3 - "$name" "$work/plan.json" "$work/steps.json" "$work/local1.json" <<'PY'
import json, statistics, sys
name, plan, steps, cl = sys.argv[1:5]
p = json.load(open(plan))["layouts"][0]
share_cal = json.load(open(cl))["fp32_ref"]["serial_share"]
st = json.load(open(steps))
rows = [r for r in st["steps"] if r["step"] >= 2]
wall = statistics.median(r["step_s"] for r in rows)
cpu = statistics.median(r["cpu_s"] for r in rows)
share = statistics.median(r["cpu_s"] / r["step_s"] for r in rows if r["step_s"] > 0)
rss = max(r["peak_rss_mib"] for r in st["steps"])
pred, pcpu, prss = p["step_s"], p["fp32_engine"]["cpu_step_s"], p["mem_per_device_gb"] * 1024
load = "%.1f-%.1f" % (st["load_before"], st["load_after"])
print("%-24s %-9s %8.3f %8.3f %+6.1f%% %8.3f %8.3f %+6.1f%% %6.2f %6.2f %9.1f %9.1f %+6.1f%%" % (
    name, load, pred, wall, 100 * (pred / wall - 1), pcpu, cpu, 100 * (pcpu / cpu - 1), share, share_cal, prss, rss,
    100 * (prss / rss - 1)))
print("  %s: step 1 %.3f s wall, %.3f s CPU (sys %.2f); steps 2..%d wall %s; CPU %s; sys %s" % (
    name, st["steps"][0]["step_s"], st["steps"][0]["cpu_s"], st["steps"][0].get("sys_s", 0), len(st["steps"]),
    " ".join("%.3f" % r["step_s"] for r in rows), " ".join("%.3f" % r["cpu_s"] for r in rows),
    " ".join("%.2f" % r.get("sys_s", 0) for r in rows)))
PY
}
if [ "$tiny" = 1 ]; then
  train_case "dsv4-tiny 1x256" configs/dsv4-tiny.json 256 1 "$steps" ""
  train_case "dsv4-tiny 2x256" configs/dsv4-tiny.json 256 2 "$steps" ""
  train_case "dsv4-tiny 1x512" configs/dsv4-tiny.json 512 1 "$steps" ""
fi
if [ "$bench" = 1 ]; then
  bsteps=2
  train_case "dsv4-bench 1x$bench_seq" configs/dsv4-bench.json "$bench_seq" 1 "$bsteps" "flock /tmp/trex-big.lock"
fi

# ---- 2. first pass, `trex model run --backward --no-logits`, the cluster's threads ----
[ "$first" = 1 ] && [ "$tiny" = 1 ] || exit 0
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
EOF
"$trex" model init --config configs/dsv4-tiny.json --seed 1 --out "$work/tiny.st" >/dev/null
printf '\n%-24s %-9s %8s %8s %8s %8s %8s %8s %7s %9s %9s %7s\n' "first pass, $threads threads" load pred_fwd \
  pred_bwd pred_tot meas_fwd meas_bwd meas_tot error pred_rss meas_rss error
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
    'BEGIN { printf "%-24s %-9s %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %+6.1f%% %9.1f %9.1f %+6.1f%%\n",
             name, l, pf, pb, pf + pb, mf, mb, mf + mb, 100 * ((pf + pb) / (mf + mb) - 1), pr, mr,
             100 * (pr / mr - 1) }'
}
case_run "dsv4-tiny 1x256" configs/dsv4-tiny.json "$work/tiny.st" "$work/tiny-1x256.st" 1 256 "$reps"
case_run "dsv4-tiny 2x128" configs/dsv4-tiny.json "$work/tiny.st" "$work/tiny-2x128.st" 2 128 "$reps"
case_run "dsv4-tiny 1x512" configs/dsv4-tiny.json "$work/tiny.st" "$work/tiny-1x512.st" 1 512 "$reps"
