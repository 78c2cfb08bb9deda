"""Print a summary of the service configuration."""
import json

with open("/app/service/config.json") as f:
    config = json.load(f)

services = config["services"]
print(f"OK: {len(services)} services on port {config['server']['port']}")
