#!/bin/bash
# Verifier for the `count-error-lines` task: judges ONLY the end state of files under /app (never the agent's words)
# and writes 1 (pass) or 0 (fail) to /logs/verifier/reward.txt. The verdict is written last (0 on any failed
# check, and 0 first so that a crash scores 0), and the whole script is one { } block, which bash parses
# completely before running it: a program under test cannot rewrite the rest of this file, and a reward it
# writes itself is overwritten by the verdict.
{
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C PYTHONNOUSERSITE=1
export HOME="$(mktemp -d)"  # fresh: nothing the agent planted in a home (site dirs, dotfiles) applies
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
# the verdict replaces /logs/verifier whole: whatever a program under test put there (a reward.json, a
# reward.txt turned into a directory or a symlink) is gone
verdict() { rm -rf /logs/verifier; mkdir -p /logs/verifier; echo "$1" > /logs/verifier/reward.txt; exit 0; }
fail() { echo "FAIL: $*"; verdict 0; }
[ -f /app/error_count.txt ] || fail "/app/error_count.txt does not exist"
got=$(tr -d ' \t\r\n' < /app/error_count.txt)
[ "$got" = "38" ] || fail "expected 38 ERROR lines, file says '$got'"
[ "$(sha256sum < /app/server.log | cut -d' ' -f1)" = "b2f9694c8c7e3a47f61076799155fd977d2b03c6816d1047a8fef54998c824fa" ] || fail "/app/server.log was modified"

echo PASS
verdict 1
}
