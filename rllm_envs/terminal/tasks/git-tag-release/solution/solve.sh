#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
export HOME=/tmp
git clone -q /app/project.bundle /app/project
cd /app/project
git config user.name "Oracle"
git config user.email "oracle@example.com"

        rel=$(git log --format='%H %s' | awk '$2 == "Release" && $3 == "1.0" {print $1}')
        git tag -a v1.0.0 -m "First stable release" "$rel"
