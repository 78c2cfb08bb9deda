#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
python3 - <<'EOF'
import json
p = "/app/service/config.json"
text = open(p).read().replace("False", "false")
import re
text = re.sub(r",(\s*[}\]])", r"\1", text).replace("'", '"')
json.dump(json.loads(text), open(p, "w"), indent=2)
EOF
