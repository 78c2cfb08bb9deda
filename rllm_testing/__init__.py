"""Test doubles shipped with rllm: `fake_upstream`, a deterministic OpenAI-compatible server in vLLM's shape."""
