#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cat > /app/linestats.sh <<'EOF'
#!/bin/bash
if [ $# -lt 1 ]; then echo "usage: $0 FILE" >&2; exit 2; fi
awk 'BEGIN { n = 0; m = 0; e = 0 }
     { n++; l = length($0); if (l > m) m = l; if (l == 0) e++ }
     END { printf "lines=%d\nlongest=%d\nempty=%d\n", n, m, e }' "$1"
EOF
chmod +x /app/linestats.sh
