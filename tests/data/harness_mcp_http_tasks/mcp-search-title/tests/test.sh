#!/bin/bash
{
mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt
grep -qx 'Kiss and Tell (1945 film)' /app/answer.txt || { echo "answer.txt does not hold the passage's title"; exit 0; }
echo 1 > /logs/verifier/reward.txt
}
