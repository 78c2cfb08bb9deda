"""rllm's small core: types, plugins, capture, gateway, rollout engine, algorithms, benchmarks, CLI."""
