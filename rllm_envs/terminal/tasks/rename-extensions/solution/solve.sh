#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cd /app/photos
for f in *.jpeg; do mv -- "$f" "${f%.jpeg}.jpg"; done
