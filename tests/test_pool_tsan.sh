#!/usr/bin/env bash
# tests/test_pool_tsan.sh — the core tests (the thread pool's among them: tests/test_core.c) built with
# ThreadSanitizer from the sources of src/core, and run: a data race or a lock-order problem in the
# pool (core/pool.c: atomics, condition variables, the job its workers read) fails the test with
# TSan's report, which a passing run of the plain build cannot show. Prints test_core's own closing
# line; exits non-zero when TSan reports (exit status 66) or a check fails.
# Env: CC (default cc).
. "$(dirname "$0")/lib.sh"
bin="$tmp/test_core_tsan"
if ! ${CC:-cc} -fsanitize=thread -O1 -g -std=c11 -D_GNU_SOURCE -pthread -Iinclude -Isrc \
     tests/test_core.c src/core/*.c -lcjson -lm -o "$bin" 2>"$tmp/cc.err"; then
  cat "$tmp/cc.err"; bad "cannot build test_core with -fsanitize=thread"; finish
fi
TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}" "$bin"
