#!/bin/bash
{
mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt
grep -qx 'hello world' /app/hello.txt || { echo "hello.txt not fixed"; exit 0; }
grep -q 'hello.txt' /app/listing.txt || { echo "no listing"; exit 0; }
echo 1 > /logs/verifier/reward.txt
}
