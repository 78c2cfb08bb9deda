#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
tr -cs 'A-Za-z' '\n' < /app/essay.txt | tr 'A-Z' 'a-z' | grep -v '^$' | sort | uniq -c \
  | sort -k1,1nr -k2,2 | head -n 5 | awk '{print $2, $1}' > /app/top_words.txt
