#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
awk '!seen[$0]++' /app/subscribers.txt > /app/unique.txt
