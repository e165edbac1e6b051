#!/usr/bin/env bash
# tests/test_lib.sh — tests/lib.sh, the preamble every script test sources, does what the runner relies
# on: finish prints `N passed, N failed` and exits non-zero after any failed check; ok, bad, expect_line
# (one check) and err_case (two checks) count as documented; `set -u` is on; the temporary folder goes at
# exit, or stays with KEEP. Each case runs a few lines after sourcing lib.sh in a fresh bash. No trex needed.
. "$(dirname "$0")/lib.sh"
lib=$(dirname "$0")/lib.sh

# probe NAME WANT_STATUS WANT_LAST_LINE CODE: bash runs `. lib.sh; CODE`; its exit status and last output
# line must be the ones given (stdout and stderr together in $tmp/NAME.out)
probe() {
  local name=$1 want_rc=$2 want_last=$3 code=$4
  bash -c ". '$lib'; $code" >"$tmp/$name.out" 2>&1; local rc=$?
  local last; last=$(tail -n 1 "$tmp/$name.out")
  if [ "$rc" = "$want_rc" ] && [ "$last" = "$want_last" ]; then ok; else
    bad "$name: exit $rc, last line '$last' (want $want_rc, '$want_last')"; sed 's/^/    /' "$tmp/$name.out"; fi
}

probe all-pass 0 "2 passed, 0 failed" 'ok; ok; finish'
probe one-fail 1 "1 passed, 1 failed" 'ok; bad "the thing"; finish'
expect_line "$tmp/one-fail.out" "^FAIL: the thing$" "bad prints FAIL: WHAT"
probe labels 0 "1 passed, 0 failed" 'ok "a label"; finish'
expect_line "$tmp/labels.out" "^PASS a label$" "ok LABEL prints PASS LABEL"
probe expect-line 1 "1 passed, 1 failed" \
  'printf "alpha 12\nbeta\n" >"$tmp/f"; expect_line "$tmp/f" "^alpha [0-9]+$" yes; expect_line "$tmp/f" "^gamma" no; finish'
expect_line "$tmp/expect-line.out" "^FAIL: no: no line matches /\^gamma/ in:$" "expect_line names what failed"
probe err-case 1 "2 passed, 2 failed" \
  'err_case refused "^boom" sh -c "echo boom >&2; exit 3"; err_case accepted "^boom" true; finish'
bash -c ". '$lib'; echo \"\$no_such_variable\"; ok; finish" >"$tmp/unset.out" 2>&1 && bad "set -u is not on: exit 0" || ok
expect_line "$tmp/unset.out" "no_such_variable: unbound variable" "set -u stops at an unset variable"

# the temporary folder: removed at exit, kept (and named) with KEEP
bash -c ". '$lib'; echo \"\$tmp\" >'$tmp/tmpname'; finish" >/dev/null 2>&1
[ -s "$tmp/tmpname" ] && [ ! -e "$(cat "$tmp/tmpname")" ] && ok || bad "tmp is left behind at exit: $(cat "$tmp/tmpname")"
KEEP=1 bash -c ". '$lib'; echo \"\$tmp\" >'$tmp/keptname'; finish" >/dev/null 2>"$tmp/keep.err"
kept=$(cat "$tmp/keptname")
[ -n "$kept" ] && [ -d "$kept" ] && grep -qF "KEEP: kept $kept" "$tmp/keep.err" && ok || bad "KEEP=1 does not keep and name tmp"
[ -n "$kept" ] && [ -d "$kept" ] && rm -rf "$kept"

finish
