#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
export HOME=/tmp
git clone -q /app/project.bundle /app/project
cd /app/project
git config user.name "Oracle"
git config user.email "oracle@example.com"

        bad=$(git log --format=%H -S'timeout=0' -- settings.ini | tail -n 1)
        git revert --no-edit "$bad"
