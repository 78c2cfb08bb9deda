#!/bin/bash
# Verifier for the `git-tag-release` task: judges ONLY the end state of files under /app (never the agent's words)
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
[ -d /app/project/.git ] || fail "/app/project is not a git repository (clone /app/project.bundle there)"
# -c: the repository's own config must not run commands in the verifier (fsmonitor, hooks)
g() { git -C /app/project -c safe.directory='*' -c core.fsmonitor=false -c core.hooksPath=/dev/null "$@"; }

[ "$(g cat-file -t refs/tags/v1.0.0 2>/dev/null)" = "tag" ] || fail "v1.0.0 is missing or not an annotated tag"
[ "$(g rev-parse 'refs/tags/v1.0.0^{commit}')" = "5f72081f8a128625c34a36c16ede76aba2f2ff89" ] || fail "v1.0.0 points to the wrong commit"
g cat-file tag refs/tags/v1.0.0 | grep -qx 'First stable release' || fail "wrong tag message"

echo PASS
verdict 1
}
