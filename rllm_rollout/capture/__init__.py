"""Capture: turn OpenAI-compatible LLM calls on the wire into Steps.

One parser/assembler (`assemble.CallAssembler`) serves both transports: the gateway (a reverse proxy,
`rllm_rollout.gateway`) and in-process capture (`inprocess.install()`, a patch of httpx / httpx2 `send`).
"""

from rllm_rollout.capture.assemble import CallAssembler, error_step
from rllm_rollout.capture.inprocess import install, is_installed, uninstall
from rllm_rollout.capture.request import CallRequest, endpoint_of, is_loopback, prepare_call
from rllm_rollout.capture.retokenize import resolve_tokenizer, retokenize, retokenize_step

__all__ = [
    "CallAssembler",
    "CallRequest",
    "endpoint_of",
    "error_step",
    "install",
    "is_installed",
    "is_loopback",
    "prepare_call",
    "resolve_tokenizer",
    "retokenize",
    "retokenize_step",
    "uninstall",
]
