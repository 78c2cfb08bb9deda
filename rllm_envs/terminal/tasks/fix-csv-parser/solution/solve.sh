#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
python3 - <<'EOF'
import re
p = "/app/inventory/inventory.py"
src = open(p).read()
src = src.replace("import sys\n", "import csv\nimport sys\n", 1)
start = src.index("    items = []")
end = src.index("    return items")
body = (
    "    items = []\n"
    "    with open(path, newline=\"\") as f:\n"
    "        for row in csv.DictReader(f):\n"
    "            if not row.get(\"sku\"):\n"
    "                continue\n"
    "            row[\"qty\"] = int(row[\"qty\"])\n"
    "            row[\"price\"] = float(row[\"price\"])\n"
    "            items.append(row)\n"
)
open(p, "w").write(src[:start] + body + src[end:])
EOF
