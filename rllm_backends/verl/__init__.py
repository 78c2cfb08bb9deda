"""verl backend for rllm: verl's own training worker/engine driven from rllm rows (imports verl lazily)."""
