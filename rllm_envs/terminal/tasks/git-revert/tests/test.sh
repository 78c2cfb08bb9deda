#!/bin/bash
# Verifier for the `git-revert` task: judges ONLY the end state of files under /app (never the agent's words)
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

new=$(g rev-parse -q --verify refs/heads/main) || fail "no branch main"
[ "$(g rev-parse "$new^" 2>/dev/null)" = "6fe3f02f82836fe2e363bdcfb5a440f1d013d5d0" ] || fail "main must be exactly one new commit on top of 6fe3f02f82"
[ "$(g rev-parse "$new^{tree}")" = "9fda10834ce439be77e56bb83d6731e9689f892f" ] || { g diff --no-ext-diff --no-textconv 6fe3f02f82836fe2e363bdcfb5a440f1d013d5d0 "$new"; fail "the new commit does not undo exactly the bad commit"; }
[ -z "$(g status --porcelain --untracked-files=no)" ] || fail "working tree has uncommitted changes"

echo PASS
verdict 1
}
