"""CLI coding agents run unchanged in a sandbox as an episode's agent (the harness seam: rllm_core.harness)."""
