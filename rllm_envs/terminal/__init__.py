"""The built-in terminal environment: the shell agent (`agent.py`) and the `terminal` tasks (`benchmark.py`)."""
