#!/bin/bash
# Verifier for the `fix-csv-parser` task: judges ONLY the end state of files under /app (never the agent's words)
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
[ -f /app/inventory/inventory.py ] || fail "/app/inventory/inventory.py is missing"
cp /tests/hidden.csv /tmp/hidden.csv
out=$(cd /tmp && timeout 20 python3 /app/inventory/inventory.py /tmp/hidden.csv 2>&1) || { echo "$out"; fail "program failed on another CSV"; }
[ "$out" = "total=45.79" ] || fail "wrong total on another CSV: $out"
(cd /tmp && timeout 20 python3 -I - <<'EOF') || fail "load() returns wrong rows"
import sys
sys.path.insert(0, "/app/inventory")
from inventory import load, total_value
rows = load("/tmp/hidden.csv")
assert [r["name"] for r in rows] == ["Tape, duct", "Glue", 'Rope "10m", blue', "Nail"], rows
assert [r["qty"] for r in rows] == [4, 1, 2, 250] and all(type(r["qty"]) is int for r in rows), rows
assert [r["price"] for r in rows] == [3.75, 0.99, 12.40, 0.02], rows
assert abs(total_value(rows) - 45.79) < 1e-9
EOF

echo PASS
verdict 1
}
