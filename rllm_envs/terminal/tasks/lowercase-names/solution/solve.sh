#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cd /app/inbox
for f in *; do
    lower=$(printf '%s' "$f" | tr 'A-Z' 'a-z')
    [ "$f" = "$lower" ] || mv -- "$f" "$lower"
done
