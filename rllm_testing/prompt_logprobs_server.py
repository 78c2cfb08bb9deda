"""A double of vLLM's prompt-logprob scoring (`POST /v1/completions` with `prompt_logprobs`), backed by a real
model: what a distillation teacher served by vLLM answers, for tests on a machine without vLLM.

The reply has vLLM's shape: `choices[0].prompt_logprobs` is a list, None at position 0, then for each prompt token
a dict keyed by the token id as a string with `{"logprob", "rank", "decoded_token"}` (with `prompt_logprobs: 0`,
only the prompt's own token). `requests` counts the calls, so a test can tell the teacher was asked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from aiohttp import web

from rllm_core.threaded_app import ThreadedApp

__all__ = ["PromptLogprobsServer", "start_prompt_logprobs_server"]


class PromptLogprobsServer:
    def __init__(self, model: Any, tokenizer: Any, name: str = "teacher") -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.requests = 0
        self.url = ""

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name, "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests += 1
        ids = body.get("prompt")
        if body.get("model") != self.name or not isinstance(ids, list) or body.get("prompt_logprobs") is None:
            return web.json_response({"error": {"message": "send model, prompt ids and prompt_logprobs"}}, status=400)
        with torch.inference_mode():
            tokens = torch.tensor([ids])
            logp = torch.log_softmax(self.model(tokens).logits[0, :-1].float(), -1)
            picked = logp.gather(-1, tokens[0, 1:, None])[:, 0]
            ranks = (logp > picked[:, None]).sum(-1) + 1
        scored: list[Any] = [None] + [
            {str(t): {"logprob": float(lp), "rank": int(r), "decoded_token": self.tokenizer.decode([t])}}
            for t, lp, r in zip(ids[1:], picked.tolist(), ranks.tolist(), strict=True)]
        return web.json_response({"object": "text_completion", "model": self.name, "choices": [
            {"index": 0, "text": "", "finish_reason": "length", "prompt_logprobs": scored}]})


@contextmanager
def start_prompt_logprobs_server(model: Any, tokenizer: Any, name: str = "teacher") -> Iterator[PromptLogprobsServer]:
    """Serve on 127.0.0.1:<free port> from a thread; `server.url` ends in /v1; always stopped."""
    server = PromptLogprobsServer(model, tokenizer, name)
    with ThreadedApp(server.make_app, name="rllm-prompt-logprobs") as http:
        server.url = f"{http.url}/v1"
        yield server
