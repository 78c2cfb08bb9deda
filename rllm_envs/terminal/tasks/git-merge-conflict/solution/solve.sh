#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
export HOME=/tmp
git clone -q /app/project.bundle /app/project
cd /app/project
git config user.name "Oracle"
git config user.email "oracle@example.com"

        git checkout -q main
        git merge -q --no-edit origin/feature || true
        printf 'Hello\nWelcome\nWelcome, friend, to the app\nBye\n' > greeting.txt
        git add greeting.txt
        git -c core.editor=true commit -q --no-edit
