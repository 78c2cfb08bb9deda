"""The `daytona` sandbox provider (`--sandbox daytona`, extra rllm[daytona]): see provider.py."""
