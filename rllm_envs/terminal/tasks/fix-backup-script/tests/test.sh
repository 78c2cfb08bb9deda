#!/bin/bash
# Verifier for the `fix-backup-script` task: judges ONLY the end state of files under /app (never the agent's words)
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
[ -f /app/backup.sh ] || fail "/app/backup.sh is missing"
src=$(mktemp -d /tmp/src\ dir.XXXX); dst="$(mktemp -d)/back up"
mkdir -p "$src/sub dir/deep" "$src/other"
echo one > "$src/a.txt"; echo two > "$src/my notes.txt"; echo three > "$src/sub dir/b.txt"
echo four > "$src/sub dir/deep/c d.txt"; echo skip > "$src/other/image.png"; echo skip > "$src/sub dir/x.txt.bak"
out=$(cd /tmp && timeout 30 bash /app/backup.sh "$src" "$dst" 2>&1) || { echo "$out"; fail "backup.sh exited non-zero"; }
[ "$out" = "copied 4 files" ] || fail "expected 'copied 4 files', got: $out"
got=$(cd "$dst" && find . -type f | sort | while IFS= read -r f; do printf '%s=%s\n' "$f" "$(cat "$f")"; done)
want=$(printf '%s\n' "./a.txt=one" "./my notes.txt=two" "./sub dir/b.txt=three" "./sub dir/deep/c d.txt=four" | sort)
[ "$got" = "$want" ] || { echo "$got"; fail "DEST does not hold exactly the .txt files at their relative paths"; }

echo PASS
verdict 1
}
