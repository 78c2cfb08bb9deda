"""Sandbox providers shipped with rllm, each a plugin of the ``rllm_register_sandbox_providers`` hook (see
rllm_core.sandbox): `local` (bubblewrap on the host's read-only system, the default)."""
