#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
export HOME=/tmp
git clone -q /app/project.bundle /app/project
cd /app/project
git config user.name "Oracle"
git config user.email "oracle@example.com"

        git log --format=%H -S'sk-live-4f9a' | tail -n 1 > /app/answer.txt
