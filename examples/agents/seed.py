"""The seed article's agent, verbatim: an OpenAI client with a placeholder key, the way vLLM users write it.

    rllm eval arithmetic --agent examples/agents/seed.py:solve --max-examples 8
    rllm train arithmetic --agent examples/agents/seed.py:solve --max-steps 20

Nothing in it knows about rllm but the decorator: `config.base_url` is the episode's session URL on the run's
gateway, which records every call (prompt ids, completion ids, logprobs). No key is needed: the session URL is
the credential, so "EMPTY" (or a key from the environment, or none) works.
"""

from openai import OpenAI

import rllm


@rllm.rollout
def solve(task, config):
    client = OpenAI(base_url=config.base_url, api_key="EMPTY")
    r = client.chat.completions.create(model=config.model, messages=[{"role": "user", "content": task.instruction}])
    return r.choices[0].message.content
