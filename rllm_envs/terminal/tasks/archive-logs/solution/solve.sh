#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cd /app
find logs -type f -name '*.log' | sort > /tmp/loglist
tar -czf /app/logs.tar.gz -T /tmp/loglist
xargs rm -f < /tmp/loglist
