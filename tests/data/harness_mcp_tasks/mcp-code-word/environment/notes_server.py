"""A third-party stdio MCP server of the agent's own, dependency-free: JSON-RPC 2.0, one message per line.

Its one tool, `code_word`, reads /app/secret.txt and logs the call to /app/mcp_calls.log, so the verifier can tell
that it ran in the task's sandbox (where /app is), started by the agent."""

import json
import sys


def reply(msg_id, result=None, error=None):
    body = {"jsonrpc": "2.0", "id": msg_id}
    body.update({"error": error} if error else {"result": result})
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    if not line.strip():
        continue
    msg = json.loads(line)
    method, msg_id = msg.get("method"), msg.get("id")
    if msg_id is None:  # a notification (notifications/initialized, ...)
        continue
    if method == "initialize":
        reply(msg_id, {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"),
                       "capabilities": {"tools": {}}, "serverInfo": {"name": "notes", "version": "1.0"}})
    elif method == "tools/list":
        reply(msg_id, {"tools": [{"name": "code_word", "description": "The code word of the day.",
                                  "inputSchema": {"type": "object", "properties": {}}}]})
    elif method == "tools/call":
        with open("/app/secret.txt") as secret:
            word = secret.read().strip()
        with open("/app/mcp_calls.log", "a") as log:
            log.write(f"code_word {json.dumps(msg['params'].get('arguments') or {})}\n")
        reply(msg_id, {"content": [{"type": "text", "text": f"WORD:{word}"}]})
    elif method == "ping":
        reply(msg_id, {})
    else:
        reply(msg_id, error={"code": -32601, "message": f"no method {method}"})
