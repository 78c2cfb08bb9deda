#!/bin/bash
{
mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt
grep -qx 'zebra-42' /app/word.txt || { echo "word.txt does not hold the code word"; exit 0; }
grep -q '^code_word' /app/mcp_calls.log || { echo "the notes server was never called in the sandbox"; exit 0; }
echo 1 > /logs/verifier/reward.txt
}
