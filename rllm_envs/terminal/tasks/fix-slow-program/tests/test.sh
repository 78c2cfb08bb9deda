#!/bin/bash
# Verifier for the `fix-slow-program` task: judges ONLY the end state of files under /app (never the agent's words)
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
[ -f /app/seq/seq.py ] || fail "/app/seq/seq.py is missing"
out=$(cd /tmp && timeout 3 python3 /app/seq/seq.py 500 2>&1) || fail "seq.py 500 failed or was too slow"
[ "$out" = "139423224561697880139724382870407283950070256587697307264108962948325571622863290691557658876222521294125" ] || fail "wrong fib(500)"
(cd /tmp && timeout 20 python3 -I - <<'EOF') || fail "fib() is wrong or too slow"
import sys, time
sys.path.insert(0, "/app/seq")
sys.setrecursionlimit(100000)
from seq import fib
a, b = 0, 1
want = []
for _ in range(5001):
    want.append(a)
    a, b = b, a + b
start = time.time()
for n in (0, 1, 2, 10, 93, 777, 5000, 3):
    assert fib(n) == want[n], n
assert time.time() - start < 5
EOF

echo PASS
verdict 1
}
