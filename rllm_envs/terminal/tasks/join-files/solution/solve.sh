#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
{
  echo "name,department"
  awk -F, 'NR == FNR { if (FNR > 1) d[$1] = $2; next }
           FNR > 1 { print (($3 in d) ? d[$3] : "UNKNOWN") "," $2 }' /app/departments.csv /app/employees.csv \
    | LC_ALL=C sort -t, -k1,1 -k2,2 | awk -F, '{print $2 "," $1}'
} > /app/report.csv
