#!/usr/bin/env bash
# Runs the test suite and prints one closing line, `N passed, N failed`, summed over every test.
#   tests/run.sh BUILD [ASAN_BUILD]
# C tests (BUILD/tests/test_*) and script tests (tests/test_*.sh, run with TREX=BUILD/trex) run from
# BUILD, test_attention and test_model also with TREX_ISA=avx512, avx512f and avx2, test_precision.sh
# with avx512f. With ASAN_BUILD, the tree is rebuilt
# there with ASan+UBSan and AMX emulated (make SAN=1 AMX_EMU=1: on a machine with AVX-512 BF16 the amx
# level runs its tile instructions in C, kernels/x86/amx/emu.h, so its leaves are tested everywhere and
# ASan checks the bytes each tile load and store touches, which it cannot see in the real instructions),
# and its C tests run again, with the script tests that carry the line `# asan: yes`. ASAN_ONLY=1 runs
# only that part, from BUILD.
# Each test prints its own `N passed, N failed`; a test that prints none counts as one check, by its exit code.
set -u
build=$1
asan=${2:-}
total_pass=0
total_fail=0
failed_names=()
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT

run_test() {   # run_test LABEL CMD...
  local label=$1; shift
  local log="$logdir/$(echo "$label" | tr '/ ' '__').log"
  local start=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  local line p f
  line=$(grep -E '^([A-Za-z-]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  if [ -n "$line" ]; then
    p=$(echo "$line" | sed -E 's/^([A-Za-z-]+: )?([0-9]+) passed, ([0-9]+) failed.*/\2/')
    f=$(echo "$line" | sed -E 's/^([A-Za-z-]+: )?([0-9]+) passed, ([0-9]+) failed.*/\3/')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  elif [ "$rc" -eq 0 ]; then p=1; f=0
  else p=0; f=1
  fi
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
  printf '%-44s %4d passed, %d failed (%ds)\n' "$label" "$p" "$f" $((SECONDS - start))
  if [ "$f" -ne 0 ]; then
    failed_names+=("$label")
    echo "---- output of $label (last 40 lines) ----"; tail -n 40 "$log"; echo "----"
  fi
}

run_tree() {   # run_tree BUILD ASAN(0|1)
  local b=$1 san=$2 t prefix=""
  [ "$san" = 1 ] && prefix="asan:"
  for t in "$b"/tests/test_*; do
    [ -x "$t" ] || continue
    run_test "$prefix$(basename "$t")" "$t"
  done
  # The model's bf16 tests again with the kernel level capped at avx512, avx512f and avx2: on a machine
  # with AMX they otherwise run only the AMX leaves, and the other tile leaves of the attention core (the
  # same body, kernels/x86/attn_tiles.h) and the FMA levels' products only in the kernel tests. A cap
  # above what the machine has is a repeat, and cheap.
  for t in test_attention test_model; do
    for isa in avx2 avx512f avx512; do
      if [ -x "$b/tests/$t" ]; then run_test "$prefix$t@$isa" env TREX_ISA=$isa "$b/tests/$t"; fi
    done
  done
  # At the FMA levels (avx2, avx512f) the LM head's logits are another product (trex_gemm_bf16_f32b):
  # its accuracy against the fp32 head, once, outside the sanitizer tree.
  if [ "$san" != 1 ]; then
    run_test "test_precision.sh@avx512f" env TREX_ISA=avx512f TREX="$b/trex" BUILD="$b" PYTHON=/usr/bin/python3 \
      bash tests/test_precision.sh
  fi
  for t in tests/test_*.sh; do
    [ -f "$t" ] || continue
    if [ "$san" = 1 ] && ! grep -q '^# asan: yes' "$t"; then continue; fi
    run_test "$prefix$(basename "$t")" env TREX="$b/trex" BUILD="$b" PYTHON=/usr/bin/python3 bash "$t"
  done
}

export TREX_THREADS=${TREX_THREADS:-2}
if [ "${ASAN_ONLY:-0}" = 1 ]; then
  ASAN_OPTIONS=detect_leaks=1 run_tree "$build" 1
else
  run_tree "$build" 0
  if [ -n "$asan" ]; then
    echo "building the ASan+UBSan tree in $asan ..."
    if make -s -j2 BUILD="$asan" SAN=1 AMX_EMU=1 OPT="-O1 -g" all >"$logdir/asan-build.log" 2>&1; then
      ASAN_OPTIONS=detect_leaks=1 run_tree "$asan" 1
    else
      tail -n 30 "$logdir/asan-build.log"; total_fail=$((total_fail + 1)); failed_names+=("asan-build")
    fi
  fi
fi
[ ${#failed_names[@]} -eq 0 ] || echo "failed: ${failed_names[*]}"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
