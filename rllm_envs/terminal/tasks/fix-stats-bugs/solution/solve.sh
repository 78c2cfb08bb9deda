#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cd /app/mathlib
sed -i -e 's|(s\[n // 2\] + s\[n // 2 + 1\]) / 2|(s[n // 2 - 1] + s[n // 2]) / 2|' \
       -e 's|return max(x for x, c in counts.items() if c == best)|return min(x for x, c in counts.items() if c == best)|' \
       -e 's|/ (len(xs) - 1)|/ len(xs)|' stats.py
