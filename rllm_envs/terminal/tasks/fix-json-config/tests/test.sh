#!/bin/bash
# Verifier for the `fix-json-config` task: judges ONLY the end state of files under /app (never the agent's words)
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
[ "$(sha256sum < /app/service/app.py | cut -d' ' -f1)" = "92a2e311f9c148d08e723285297e3aefd9d7aef23236d94d8546c34a33d00713" ] || fail "app.py was modified"
out=$(cd /tmp && timeout 20 python3 /app/service/app.py 2>&1) || { echo "$out"; fail "app.py still fails"; }
[ "$out" = "OK: 3 services on port 8080" ] || fail "unexpected output: $out"
python3 -I - <<'EOF' || fail "config.json does not hold the intended settings"
import json, sys
got = json.load(open("/app/service/config.json"))
want = json.loads("{\"server\": {\"host\": \"0.0.0.0\", \"port\": 8080}, \"services\": [{\"name\": \"auth\", \"replicas\": 2}, {\"name\": \"billing\", \"replicas\": 1}, {\"name\": \"search\", \"replicas\": 3}], \"debug\": false}")
sys.exit(0 if got == want else 1)
EOF

echo PASS
verdict 1
}
