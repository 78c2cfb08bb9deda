"""Framework adapters: one sub-package per agent framework, each behind its own pip extra.

    rllm_adapters.langchain      RLLMCallbackHandler, install()           pip install "rllm[langchain]"
    rllm_adapters.langgraph      RLLMCallbackHandler, wrap_graph()        pip install "rllm[langgraph]"
    rllm_adapters.autogen        wrap_team()                              pip install "rllm[autogen]"
    rllm_adapters.openai_sdk     wrap_client()                            (core)
    rllm_adapters.openai_agents  run_config(), install()                  pip install "rllm[openai-agents]"

Nothing framework-specific is imported here: every adapter registers through its `plugin` module, which the
plugin manager loads whether or not the framework is installed. What is exported here is the toolkit every
adapter (built-in or third-party, see docs/adapters.md) is built from:

- `AdapterWarning`: an untested framework version, a call outside @rllm.rollout (to filter, or make errors);
- `require_framework` / `check_version`: the ImportError naming the extra, the warning naming the range;
- `enter_scopes`: set the agent name (and episode) from a start callback, undo it from the end callback;
- `call_log` / `CallRecord`: log framework ids per call, joined into the wire Steps when the episode ends
  (`call_log.join(episode, framework=...)` from the plugin's `rllm_on_episode_end`);
- `open_adhoc_episode` / `finish_adhoc_episode`: record calls made outside @rllm.rollout.
"""

from rllm_adapters._common import (
    AdapterWarning,
    CallRecord,
    call_log,
    check_version,
    enter_scopes,
    finish_adhoc_episode,
    open_adhoc_episode,
    require_framework,
)

__all__ = [
    "AdapterWarning",
    "CallRecord",
    "call_log",
    "check_version",
    "enter_scopes",
    "finish_adhoc_episode",
    "open_adhoc_episode",
    "require_framework",
]
