#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
grep -oE '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}' /app/messages.txt | tr 'A-Z' 'a-z' | LC_ALL=C sort -u > /app/addresses.txt
