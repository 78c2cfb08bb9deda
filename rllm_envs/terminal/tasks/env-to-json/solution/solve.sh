#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
python3 - <<'EOF'
import json
out = {}
for line in open("/app/settings.env"):
    line = line.rstrip("\n")
    if not line.strip() or line.startswith("#"):
        continue
    key, value = line.split("=", 1)
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if value.isdigit():
        out[key] = int(value)
    elif value in ("true", "false"):
        out[key] = value == "true"
    else:
        out[key] = value
json.dump(out, open("/app/settings.json", "w"), indent=2)
EOF
