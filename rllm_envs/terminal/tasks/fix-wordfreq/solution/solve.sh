#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cat > /app/wordfreq.py <<'EOF'
"""wordfreq.py FILE N: the N most frequent words of FILE, as "word count", most frequent first (ties: a-z)."""
import sys
from collections import Counter


def top_words(text, n):
    counts = Counter(text.lower().split())
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


if __name__ == "__main__":
    text = open(sys.argv[1]).read()
    for word, count in top_words(text, int(sys.argv[2])):
        print(word, count)
EOF
