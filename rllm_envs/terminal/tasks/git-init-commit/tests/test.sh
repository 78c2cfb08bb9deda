#!/bin/bash
# Verifier for the `git-init-commit` task: judges ONLY the end state of files under /app (never the agent's words)
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
[ -d /app/site/.git ] || fail "/app/site/.git does not exist"
g() { git -C /app/site -c safe.directory='*' -c core.fsmonitor=false -c core.hooksPath=/dev/null "$@"; }
[ "$(g symbolic-ref --short HEAD 2>/dev/null)" = "main" ] || fail "HEAD is not the branch main"
[ "$(g rev-list --count HEAD 2>/dev/null)" = "1" ] || fail "main must have exactly one commit"
[ "$(g log -1 --format=%s)" = "Initial import" ] || fail "wrong commit message: $(g log -1 --format=%s)"
[ "$(g log -1 --format='%an <%ae>')" = "Site Bot <bot@example.com>" ] || fail "wrong author: $(g log -1 --format='%an <%ae>')"
[ "$(g ls-tree -r --name-only HEAD | sort)" = "$(sort /tests/files.txt)" ] || fail "the commit does not hold exactly the site files"
[ "$(g show HEAD:index.html | sha256sum | cut -d" " -f1)" = "320a24004f649a98b65535e7c06bd8df344e10a3d006316ac63dbbacb1db0203" ] || fail "site/index.html in the commit differs from the file given"
[ "$(g show HEAD:css/style.css | sha256sum | cut -d" " -f1)" = "c5d674ffb3cd445f2bd80f3943577b3a4778c033b056a5ec08948bfe7bf95dfb" ] || fail "site/css/style.css in the commit differs from the file given"
[ "$(g show HEAD:README.md | sha256sum | cut -d" " -f1)" = "acc88566af21da34336073acfa06440d6e5f269a0242a06e3a1bc07288c0bee4" ] || fail "site/README.md in the commit differs from the file given"
[ -z "$(g status --porcelain)" ] || fail "working tree is not clean"

echo PASS
verdict 1
}
