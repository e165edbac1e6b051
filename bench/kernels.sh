#!/usr/bin/env bash
# bench/kernels.sh — the kernel benchmarks of docs/perf.md ("Kernels"), kept as JSON.
#   bench/kernels.sh [TREX] [OUTDIR]      defaults: build/trex, ${TMPDIR:-/tmp}/trex-bench
# Runs `trex bench peak` and `trex bench kernels` (1 thread, then every thread of the pool) with --json
# and writes OUTDIR/kernels-DATE-HOST-{peak,kernels-t1,kernels}.json, then prints a short summary. Extra
# options for `trex bench kernels` can be given in KERNELS_OPTS (e.g. "--reps 9 --filter square").
# Figures are medians; on a shared machine read the per-CPU-second columns (docs/kernels.md).
set -euo pipefail
trex=${1:-build/trex}
out=${2:-${TMPDIR:-/tmp}/trex-bench}
[ -x "$trex" ] || { echo "bench/kernels.sh: $trex is not an executable (build it: make)" >&2; exit 2; }
mkdir -p "$out"
stamp="$(date -u +%Y-%m-%d)-$(hostname -s)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$trex" bench peak --reps 5 --json >"$out/kernels-$stamp-peak.json"
# shellcheck disable=SC2086
"$trex" bench kernels --reps 5 --threads 1 --json ${KERNELS_OPTS:-} >"$out/kernels-$stamp-kernels-t1.json"
# shellcheck disable=SC2086
"$trex" bench kernels --reps 5 --json ${KERNELS_OPTS:-} >"$out/kernels-$stamp-kernels.json"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
/usr/bin/python3 - "$out/kernels-$stamp-peak.json" "$out/kernels-$stamp-kernels-t1.json" \
    "$out/kernels-$stamp-kernels.json" <<'PY'
import json, sys
peak = json.load(open(sys.argv[1]))
print("peak (TFLOP/s):", {k: round(v["per_core"], 3) for k, v in peak["peak_tflops"].items()},
      "per core;", {k: round(v["all_threads"], 3) for k, v in peak["peak_tflops"].items()},
      "all", peak["threads"], "threads; copy", round(peak["copy_gbs"], 1), "GB/s")
for path in sys.argv[2:]:
    k = json.load(open(path))
    print(f"\n{k['threads']} thread(s), level {k['level']} ({k['gemm']}), per-core peak "
          f"{k['core_peak_tflops_per_cpu_second']:.2f} TFLOP/s per CPU-second")
    print(f"{'case':30} {'shape':18} {'TFLOP/s':>8} {'cpu-TF':>7} {'%core':>6} | oneDNN {'TFLOP/s':>7} "
          f"{'cpu-TF':>7} | packed {'TFLOP/s':>7} {'cpu-TF':>7}")
    nan = float("nan")
    for r in k["kernels"]:
        print(f"{r['name']:30} {r['shape']:18} {r['tflops']:8.3f} {r['cpu_tflops']:7.3f} "
              f"{r['pct_core_peak']:5.1f}% |        {r.get('onednn_tflops', nan):7.3f} "
              f"{r.get('onednn_cpu_tflops', nan):7.3f} |        {r.get('onednn_packed_tflops', nan):7.3f} "
              f"{r.get('onednn_packed_cpu_tflops', nan):7.3f}")
    if k.get("packing"):
        print("packing, 1 thread, GB of source per CPU-second: cycled over 128 MiB | one operand")
        for r in k["packing"]:
            print(f"{r['name']:30} {r['gbs_cycled']:7.2f} | {r['gbs_one_operand']:7.2f}")
PY
