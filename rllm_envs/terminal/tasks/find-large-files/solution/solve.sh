#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cd /app/data
find . -type f -size +2048c | sed 's|^\./||' | LC_ALL=C sort > /app/large_files.txt
