#!/bin/bash
# Verifier for the `replace-text` task: judges ONLY the end state of files under /app (never the agent's words)
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
[ -d /app/docs ] || fail "/app/docs is missing"
actual=$(cd /app/docs && find . -type f | sed 's|^\./||' | sort | while IFS= read -r f; do
    printf '%s  %s\n' "$(sha256sum < "$f" | cut -d' ' -f1)" "$f"; done | sort -k2)
expected=$(sort -k2 /tests/manifest.txt)
if [ "$actual" != "$expected" ]; then
    diff <(echo "$expected") <(echo "$actual")
    fail "files under /app/docs (names or contents) differ from what was asked"
fi

echo PASS
verdict 1
}
