#!/usr/bin/env bash
# bench/compare.sh — trex against PyTorch on the same DeepSeek-V4 training step, side by side.
#
#   bench/compare.sh [--config C] [--seq T] [--mbs B] [--rounds R] [--steps N] [--warmup W]
#                    [--threads N] [--weights FILE] [--no-lock] [--log-dir DIR] [BUILD]
#
# Runs R rounds; each round runs `BUILD/trex bench step --config C --seq T --mbs B --precision bf16
# --optimizer adamw --json` and `bench/pytorch_step.py` (the tests/ref model in PyTorch with bf16
# autocast, AdamW) on the same config and sizes, one after the other; the order alternates between rounds
# (trex first in odd rounds) so that a drift of the machine's load does not favour one side. Prints each
# round's tokens/s for both and their ratio, the medians over rounds, and as its last line exactly
#   ratio: <trex tokens/s / pytorch tokens/s>
# where the ratio is the median over rounds of each round's ratio (the two runs of a round are side by
# side, so a round's ratio is the figure least touched by the load of the machine).
# Runs of configs/dsv4-bench.json each hold `flock /tmp/trex-big.lock` (big runs never overlap);
# --no-lock when the caller already holds it (`flock /tmp/trex-big.lock bench/compare.sh --no-lock ...`:
# one wait for the lock instead of one per run). --log-dir DIR keeps each run's output there
# (trex.R.json / pytorch.R.json, stderr in .err).
# PyTorch gets the weights of `trex model init --config C --seed 1` (those `trex bench step` builds with
# its default seed 1), written once to a temporary file unless --weights FILE names them.
# Defaults: configs/dsv4-bench.json, T=512, B=1, 3 rounds, 3 timed steps after 1 warm-up step, 2 threads,
# BUILD=build. Env: PYTHON (default /usr/bin/python3, with torch), TREX (default BUILD/trex),
# OMP_WAIT_POLICY for the PyTorch runs (default passive: PyTorch's libgomp threads then sleep instead of
# spinning at barriers, which on this shared 2-core machine makes its steps up to 5x faster under load;
# docs/perf.md "Against PyTorch").
# Exit status: 0 with the ratio line; 1 on bad arguments or when a run fails (its log tail is printed,
# a PyTorch out-of-memory is named as such), and then no ratio line.
set -u
cd "$(dirname "$0")/.." || exit 1

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

config=configs/dsv4-bench.json
seq=512
mbs=1
rounds=3
steps=3
warmup=1
threads=2
weights=
build=build
nolock=0
logdir=
while [ $# -gt 0 ]; do
  case $1 in
    --config) config=${2-}; shift 2 || break ;;
    --seq) seq=${2-}; shift 2 || break ;;
    --mbs) mbs=${2-}; shift 2 || break ;;
    --rounds) rounds=${2-}; shift 2 || break ;;
    --steps) steps=${2-}; shift 2 || break ;;
    --warmup) warmup=${2-}; shift 2 || break ;;
    --threads) threads=${2-}; shift 2 || break ;;
    --weights) weights=${2-}; shift 2 || break ;;
    --no-lock) nolock=1; shift ;;
    --log-dir) logdir=${2-}; shift 2 || break ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "compare.sh: unknown option $1 (--help lists them)" >&2; exit 1 ;;
    *) build=$1; shift ;;
  esac
done
for v in seq mbs rounds steps threads; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then echo "compare.sh: --$v needs a positive integer (got '${!v}')" >&2; exit 1; fi
done
if ! [[ $warmup =~ ^[0-9]+$ ]]; then echo "compare.sh: --warmup needs an integer >= 0 (got '$warmup')" >&2; exit 1; fi
if [ ! -f "$config" ]; then echo "compare.sh: config $config not found" >&2; exit 1; fi
TREX=${TREX:-$build/trex}
PY=${PYTHON:-/usr/bin/python3}
omp_wait=${OMP_WAIT_POLICY:-passive}
if [ ! -x "$TREX" ]; then echo "compare.sh: $TREX not found or not executable (build first: make BUILD=$build)" >&2; exit 1; fi
if [ -n "$weights" ] && [ ! -f "$weights" ]; then echo "compare.sh: weights $weights not found" >&2; exit 1; fi

lock=()
if [ "$(basename "$config")" = dsv4-bench.json ] && [ "$nolock" = 0 ]; then lock=(flock /tmp/trex-big.lock); fi
if [ -n "$logdir" ] && ! mkdir -p "$logdir"; then echo "compare.sh: cannot create --log-dir $logdir" >&2; exit 1; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -z "$weights" ]; then
  weights=$tmp/w.safetensors
  if ! "${lock[@]}" "$TREX" model init --config "$config" --seed 1 --out "$weights" >"$tmp/init.log" 2>&1; then
    tail -n 20 "$tmp/init.log"; echo "compare.sh: trex model init failed" >&2; exit 1
  fi
fi

# json_field FILE KEY: KEY of the last JSON object of FILE that starts a line (one line or pretty-printed
# over several); empty when absent.
json_field() {
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
text = open(sys.argv[1], errors="replace").read()
dec = json.JSONDecoder()
obj = None
pos = 0
while True:
    i = text.find("{", pos)
    if i < 0:
        break
    pos = i + 1
    if i > 0 and text[i - 1] != "\n":
        continue
    try:
        o, end = dec.raw_decode(text, i)
    except ValueError:
        continue
    if isinstance(o, dict):
        obj, pos = o, end
v = obj.get(sys.argv[2]) if isinstance(obj, dict) else None
print("" if v is None else v)
EOF
}

# run_side NAME OUTFILE: runs one side, leaves tokens/s in $tps; returns 1 on failure.
run_side() {
  local name=$1 out=$2 rc
  if [ "$name" = trex ]; then
    "${lock[@]}" "$TREX" bench step --config "$config" --seq "$seq" --mbs "$mbs" --steps "$steps" \
      --warmup "$warmup" --precision bf16 --optimizer adamw --threads "$threads" --json >"$out" 2>"$out.err"
  else
    OMP_WAIT_POLICY=$omp_wait "${lock[@]}" "$PY" bench/pytorch_step.py --config "$config" --seq "$seq" --mbs "$mbs" --steps "$steps" \
      --warmup "$warmup" --threads "$threads" --weights "$weights" --optimizer adamw --json >"$out" 2>"$out.err"
  fi
  rc=$?
  if [ -n "$logdir" ]; then cp "$out" "$out.err" "$logdir"/; fi
  tps=$(json_field "$out" tokens_per_s)
  if [ "$rc" -ne 0 ] || [ -z "$tps" ]; then
    local err
    err=$(json_field "$out" error)
    if [ -n "$err" ]; then echo "$name: $err" >&2
    elif [ "$rc" -ge 128 ]; then echo "$name: killed by signal $((rc - 128)) (out of memory?)" >&2
    fi
    echo "---- $name failed (exit $rc); last lines of its output ----" >&2
    tail -n 15 "$out.err" >&2; tail -n 3 "$out" >&2
    return 1
  fi
  step_s=$(json_field "$out" step_s)
  return 0
}

echo "compare: $(basename "$config") T=$seq B=$mbs, $rounds rounds of $steps timed steps (+$warmup warm-up)," \
  "$threads threads, PyTorch OMP_WAIT_POLICY=$omp_wait; $(date -u '+%F %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
trex_all=()
torch_all=()
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="trex pytorch"; else order="pytorch trex"; fi
  for side in $order; do
    run_side "$side" "$tmp/$side.$r.json" || exit 1
    if [ "$side" = trex ]; then trex_all+=("$tps"); t_tps=$tps; t_step=$step_s
    else torch_all+=("$tps"); p_tps=$tps; p_step=$step_s; p_rss=$(json_field "$tmp/$side.$r.json" peak_rss_mib); fi
  done
  printf 'round %d: trex %.2f tokens/s (%.3f s/step)  pytorch %.2f tokens/s (%.3f s/step, peak RSS %.0f MiB)  ratio %s  [%s first; load %s]\n' \
    "$r" "$t_tps" "$t_step" "$p_tps" "$p_step" "$p_rss" "$("$PY" -c "print(f'{$t_tps / $p_tps:.2f}')")" \
    "${order%% *}" "$(cut -d' ' -f1 /proc/loadavg)"
done

"$PY" - "${trex_all[*]}" "${torch_all[*]}" <<'EOF'
import statistics, sys
t = [float(x) for x in sys.argv[1].split()]
p = [float(x) for x in sys.argv[2].split()]
mt, mp = statistics.median(t), statistics.median(p)
print(f"median: trex {mt:.2f} tokens/s  pytorch {mp:.2f} tokens/s  (ratio of the medians {mt / mp:.2f})")
print(f"ratio: {statistics.median(a / b for a, b in zip(t, p)):.2f}")
EOF
