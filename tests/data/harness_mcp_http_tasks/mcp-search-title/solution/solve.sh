#!/bin/bash
echo 'Kiss and Tell (1945 film)' > /app/answer.txt
