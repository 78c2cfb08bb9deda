#!/bin/bash
echo '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"code_word","arguments":{}}}' \
  | python3 /app/notes_server.py | sed -n 's/.*WORD:\([^"]*\).*/\1/p' > /app/word.txt
