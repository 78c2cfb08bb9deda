#!/bin/bash
# Verifier for the `makefile-fix` task: judges ONLY the end state of files under /app (never the agent's words)
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
[ -f /app/Makefile ] || fail "/app/Makefile is missing"
cd /app || fail "no /app"
rm -rf /app/build
timeout 30 make -C /app build >/tmp/make.out 2>&1 || { cat /tmp/make.out; fail "make build failed"; }
diff /app/build/bundle.txt <(cat /app/src/header.txt /app/src/body.txt /app/src/footer.txt) || fail "bundle content is wrong"
grep -qx 'body line 2' /app/build/bundle.txt || fail "src/body.txt is not in the bundle (or was edited)"
# The bundle must follow the sources: change one and rebuild from scratch.
echo "verifier line $$" >> /app/src/body.txt
timeout 30 make -C /app clean >/dev/null 2>&1 || fail "make clean failed"
[ ! -e /app/build ] || fail "make clean did not remove build/"
timeout 30 make -C /app build >/dev/null 2>&1 || fail "make build failed on the second run"
grep -qx "verifier line $$" /app/build/bundle.txt || fail "bundle is not rebuilt from src/ (hard-coded?)"

echo PASS
verdict 1
}
