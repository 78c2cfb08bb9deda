#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
python3 - <<'EOF'
import csv
with open("/app/people.csv", newline="") as f, open("/app/emails.txt", "w") as out:
    for row in csv.DictReader(f):
        out.write(row["email"] + "\n")
EOF
