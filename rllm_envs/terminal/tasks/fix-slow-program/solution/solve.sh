#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cat > /app/seq/seq.py <<'EOF'
"""seq.py N: print the N-th Fibonacci number (fib(0) = 0, fib(1) = 1)."""
import sys


def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


if __name__ == "__main__":
    print(fib(int(sys.argv[1])))
EOF
