"""Reference demonstrations: a benchmark's reference solutions played by its own (unchanged) agent, so `rllm sft`
can start a policy on a task it never solves (oracles.py, server.py, cli.py)."""
