"""Running agents as episodes: `@rollout`, the episode engine, the Benchmark seam and its registry, capture,
the recording gateway, and the local and Ray rollout executors."""
