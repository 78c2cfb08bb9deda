#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
awk '$3 == "ERROR"' /app/server.log | wc -l | tr -d ' ' > /app/error_count.txt
