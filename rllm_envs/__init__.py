"""rllm environments: benchmarks that come with their own tools or sandboxed tasks (FinQA, Harbor, terminal)."""
