#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
awk -F'"' '{split($3, a, " "); print a[1]}' /app/access.log | sort | uniq -c \
  | sort -k1,1nr -k2,2 | awk '{print $2, $1}' > /app/status_counts.txt
awk '{print $1}' /app/access.log | sort | uniq -c | sort -k1,1nr | head -n 1 | awk '{print $2}' > /app/top_ip.txt
