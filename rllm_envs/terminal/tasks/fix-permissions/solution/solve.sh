#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
find /app/scripts -type f -name '*.sh' -exec chmod u+x {} +
chmod a-x /app/scripts/README.txt
find /app/data -type f -exec chmod a-x {} +
chmod 600 /app/private/token.txt
chmod 700 /app/private
