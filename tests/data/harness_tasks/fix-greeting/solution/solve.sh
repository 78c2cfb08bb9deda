#!/bin/bash
ls /app > /app/listing.txt
echo "hello world" > /app/hello.txt
