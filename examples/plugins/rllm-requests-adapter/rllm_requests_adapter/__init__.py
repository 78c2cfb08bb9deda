"""Capture LLM calls made with `requests` into rllm episodes (an example third-party rllm plugin)."""

from rllm_requests_adapter.capture import install, is_installed, uninstall

__all__ = ["install", "is_installed", "uninstall"]
__version__ = "0.1.0"
