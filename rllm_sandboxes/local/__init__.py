"""The `local` sandbox provider: bubblewrap (`bwrap`) on the host's read-only system, no network, rlimits, one
unprivileged uid per sandbox when running as root. See `rllm_sandboxes.local.provider` for the whole contract."""

from rllm_sandboxes.local.provider import LocalSandbox, LocalSandboxProvider

__all__ = ["LocalSandbox", "LocalSandboxProvider"]
