#!/bin/bash
# Verifier for the `git-merge-conflict` task: judges ONLY the end state of files under /app (never the agent's words)
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

m=$(g rev-parse -q --verify refs/heads/main) || fail "no branch main"
[ "$(g rev-list --parents -n 1 "$m")" = "$m 44343ff4e70c991f4c978ee93ede30407a0226e0 5548338126aa1bb735508d6090a796c670dcd291" ] || fail "main's tip is not a merge of 44343ff4e7 and 5548338126"
[ "$(g show "$m:greeting.txt" | sha256sum | cut -d' ' -f1)" = "4ab2c39b854ba8136824338623bc1ce9e49a0f3695781e36ed0c2d7a366dacef" ] || { g show "$m:greeting.txt"; fail "greeting.txt is not resolved as asked"; }
[ "$(g show "$m:feature.txt" 2>/dev/null)" = "new feature" ] || fail "feature.txt from the feature branch is missing"
[ "$(g show "$m:app.py" 2>/dev/null)" = "print('hi')" ] || fail "app.py changed"

echo PASS
verdict 1
}
