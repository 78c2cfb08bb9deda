#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cat > /app/stats.py <<'EOF'
import sys

nums = sorted(float(line) for line in sys.stdin if line.strip())
n = len(nums)
median = nums[n // 2] if n % 2 else (nums[n // 2 - 1] + nums[n // 2]) / 2
print(f"count={n} mean={sum(nums) / n:.2f} median={median:.2f} max={nums[-1]:.2f}")
EOF
