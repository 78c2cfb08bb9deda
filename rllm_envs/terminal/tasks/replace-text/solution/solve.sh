#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
find /app/docs -type f -name '*.txt' -exec sed -i 's/colour/color/g; s/Colour/Color/g' {} +
