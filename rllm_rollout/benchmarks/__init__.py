"""The Benchmark seam: what a benchmark is, the registry every plugin's benchmarks are collected in, where
their data lives, and the default single-turn rollout. The built-in benchmarks live in rllm_envs.benchmarks."""
