#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
grep -Ev '^[[:space:]]*([#;]|$)' /app/config.ini > /app/config.clean
