#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
export HOME=/tmp
cd /app/site
git init -q -b main
git add -A
git -c user.name="Site Bot" -c user.email="bot@example.com" commit -q -m "Initial import"
