#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
python3 - <<'EOF'
import csv, json
users = sorted(json.load(open("/app/users.json")), key=lambda u: int(u["id"]))
with open("/app/users.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["id", "name", "email", "age"])
    for u in users:
        w.writerow([u["id"], u["name"], u["email"], u["age"]])
EOF
