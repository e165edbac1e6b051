# tests/lib.sh — the preamble of the script tests, sourced first by each: . "$(dirname "$0")/lib.sh"
# It sets `set -u`, and defines:
#   TREX      the trex binary (env TREX, default build/trex)
#   PY        the Python interpreter (env PYTHON, default /usr/bin/python3)
#   tmp       a fresh temporary folder, removed at exit (kept, and named on stderr, when KEEP is set)
#   pass fail the check counters; ok [LABEL] counts a pass (and prints `PASS LABEL` when given one),
#             bad WHAT counts a failure and prints `FAIL: WHAT`
#   expect_line FILE REGEX WHAT    one check: some line of FILE matches the extended REGEX
#   err_case WHAT REGEX CMD...     two checks: CMD exits non-zero; its stderr matches REGEX
#   finish    prints the closing line `N passed, N failed` and exits, with status 0 only when no check
#             failed; every test ends with it (or ends with a command that prints its own line)
# Tests run from the repository root (tests/run.sh does); the runner counts by the closing line.
set -u
TREX=${TREX:-build/trex}
PY=${PYTHON:-/usr/bin/python3}
pass=0
fail=0
tmp=$(mktemp -d)
trap 'if [ -n "${KEEP:-}" ]; then echo "KEEP: kept $tmp" >&2; else rm -rf "$tmp"; fi' EXIT

ok() { pass=$((pass + 1)); if [ $# -gt 0 ]; then echo "PASS $*"; fi; }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

expect_line() {   # expect_line FILE REGEX WHAT
  if grep -Eq -- "$2" "$1"; then ok; else bad "$3: no line matches /$2/ in:"; sed 's/^/    /' "$1" | head -40; fi
}

err_case() {   # err_case WHAT REGEX CMD...
  local what=$1 re=$2; shift 2
  "$@" >"$tmp/err_case.out" 2>"$tmp/err_case.err"; local rc=$?
  if [ $rc -ne 0 ]; then ok; else bad "$what: exit status 0, want non-zero"; fi
  expect_line "$tmp/err_case.err" "$re" "$what"
}

finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
  exit
}
