#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cd /app/reports
for f in *.txt; do
    if [[ $f =~ ^(.+)-([0-9]{2})-([0-9]{2})-([0-9]{4})\.txt$ ]]; then
        mv -- "$f" "${BASH_REMATCH[4]}-${BASH_REMATCH[2]}-${BASH_REMATCH[3]}-${BASH_REMATCH[1]}.txt"
    fi
done
