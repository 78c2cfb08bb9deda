"""One exception root and one warning root for rllm; every error says what was wrong and what to do.

    RLLMError
    ├── ConfigError          bad options, files or arguments given by the user
    ├── PluginError          a plugin could not be loaded or registered
    ├── CaptureError         a recorded LLM call could not be understood
    ├── UpstreamError        the model endpoint failed (unreachable, timed out, refused the request)
    ├── BenchmarkError       unknown benchmark, missing data file, unexpected fields
    └── TrainingError        a training step cannot go on (no trainable rows, NaN loss, out of memory)

    RLLMWarning (UserWarning)  something worked, but not as asked: filter every rllm warning with one class
    ├── RolloutFailedWarning   rllm_rollout.rollout: the agent raised or timed out (the Episode says why)
    ├── AdapterWarning         rllm_adapters: a framework call an adapter could not attribute
    └── HarborTaskWarning      rllm_envs.harbor: a task folder with ignored keys or a verifier that may trust
                               agent code
"""

from __future__ import annotations

__all__ = [
    "BenchmarkError",
    "CaptureError",
    "ConfigError",
    "PluginError",
    "RLLMError",
    "RLLMWarning",
    "TrainingError",
    "UpstreamError",
]


class RLLMError(Exception):
    """Root of every error rllm raises on purpose."""


class ConfigError(RLLMError):
    """Bad options, files or arguments given by the user."""


class PluginError(RLLMError):
    """A plugin could not be loaded or registered."""


class CaptureError(RLLMError):
    """A recorded LLM call could not be understood."""


class UpstreamError(RLLMError):
    """The model endpoint failed: unreachable, timed out, or refused the request."""


class BenchmarkError(RLLMError):
    """Unknown benchmark, missing data file, or unexpected fields."""


class TrainingError(RLLMError):
    """A training step cannot go on."""


class RLLMWarning(UserWarning):
    """Root of every warning rllm issues on purpose: `warnings.simplefilter("error", RLLMWarning)` in a test
    suite, or "ignore" in a notebook, catches them all."""
