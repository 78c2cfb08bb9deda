#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
export HOME=/tmp
git clone -q /app/project.bundle /app/project
cd /app/project
git config user.name "Oracle"
git config user.email "oracle@example.com"

        git checkout -q -b feature/login main
        echo "login v1" > login.txt
        git add login.txt
        git commit -q -m "Add login page"
