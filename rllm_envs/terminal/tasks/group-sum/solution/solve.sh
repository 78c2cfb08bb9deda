#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
python3 - <<'EOF'
import csv
from collections import defaultdict
from decimal import Decimal
totals = defaultdict(Decimal)
for row in csv.DictReader(open("/app/orders.csv", newline="")):
    if row["status"] == "paid":
        totals[row["customer"]] += Decimal(row["amount"])
with open("/app/totals.csv", "w") as f:
    f.write("customer,total\n")
    for c in sorted(totals):
        f.write(f"{c},{totals[c]:.2f}\n")
EOF
