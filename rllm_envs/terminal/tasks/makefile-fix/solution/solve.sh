#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
sed -i -e 's/^    /\t/' -e 's|src/bdy.txt|src/body.txt|' /app/Makefile
