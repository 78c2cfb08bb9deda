"""Token ids for upstreams that return none (hosted APIs): rebuilt with a tokenizer, and marked as such.

The ids are our tokenizer's reading of the text, not the server's: Steps get `token_source="retokenized"`
so a trainer can tell them apart. A chat prompt is rendered with the tokenizer's chat template (with the
request's tools); the completion is the reply text, plus EOS when the model stopped on its own, or for tool
calls the template's rendering of the assistant turn beyond the prompt.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.types import Step

__all__ = ["resolve_tokenizer", "retokenize", "retokenize_step"]

_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _load(path: str) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - transformers is in the serve extra
        raise ConfigError("retokenizing needs transformers: pip install 'rllm[serve]'") from exc
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise ConfigError(
            f"could not load tokenizer {path!r} ({type(exc).__name__}: {exc}); give a local tokenizer folder "
            "or a model name already in the Hugging Face cache"
        ) from exc


def resolve_tokenizer(spec: Any) -> Any:
    """None → None; a str → the Hugging Face tokenizer at that path (loaded once); anything else as is."""
    if spec is None or not isinstance(spec, str):
        return spec
    with _lock:
        return _load(spec)


def _encode(tok: Any, text: str, special: bool) -> list[int]:
    return list(tok.encode(text, add_special_tokens=special))


def _render(tok: Any, messages: list[dict[str, Any]], tools: Any, gen_prompt: bool) -> str:
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": gen_prompt}
    if tools:
        kwargs["tools"] = tools
    return str(tok.apply_chat_template(messages, **kwargs))


def retokenize(
    tokenizer: Any,
    endpoint: str,
    messages: list[dict[str, Any]] | None,
    prompt: Any,
    text: str | None,
    tool_calls: list[dict[str, Any]] | None,
    finish_reason: str | None,
    tools: Any = None,
) -> tuple[list[int], list[int]]:
    """Return (prompt_token_ids, completion_token_ids) rebuilt from text with `tokenizer`."""
    tok = resolve_tokenizer(tokenizer)
    if endpoint in ("chat", "responses"):  # a Responses step is chat-shaped (messages from its input)
        prompt_text = _render(tok, messages or [], tools, gen_prompt=True)
        prompt_ids = _encode(tok, prompt_text, special=False)
        if tool_calls:
            turn = {"role": "assistant", "content": text or "", "tool_calls": tool_calls}
            full = _render(tok, [*(messages or []), turn], tools, gen_prompt=False)
            if full.startswith(prompt_text):
                return prompt_ids, _encode(tok, full[len(prompt_text):], special=False)
    elif isinstance(prompt, list):
        prompt_ids = [int(t) for t in prompt]
    else:
        prompt_ids = _encode(tok, str(prompt or ""), special=True)
    completion_ids = _encode(tok, text or "", special=False)
    eos = getattr(tok, "eos_token_id", None)
    if finish_reason == "stop" and isinstance(eos, int):
        completion_ids.append(eos)
    return prompt_ids, completion_ids


def _misaligned(tok: Any, ids: list[int], logprobs: Any, tokens: Any) -> str | None:
    """Why the server's logprobs cannot be trusted as the logprobs of our retokenized `ids` (None: they can).

    Equal counts are not enough: "Hello" sampled as "Hel"+"lo" and retokenized as "Hell"+"o" has two of each,
    and each logprob would be trained on the wrong token. They line up only when the server named its tokens
    and each one is exactly the text of ours at the same position."""
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        return "no server logprobs" if not isinstance(logprobs, list) else (
            f"{len(logprobs)} server logprobs for {len(ids)} retokenized tokens")
    if not isinstance(tokens, list) or len(tokens) != len(ids):
        return "the server sent no token strings with its logprobs, so they cannot be matched to our tokens"
    for pos, (tid, text) in enumerate(zip(ids, tokens, strict=True)):
        ours = tok.decode([tid])
        if ours != text:
            return f"token {pos}: ours is {ours!r}, the server's {text!r}"
    return None


def retokenize_step(step: Step, tokenizer: Any) -> Step:
    """A Step that came back without ids, rebuilt with `tokenizer` and marked `token_source="retokenized"`.

    Steps that already carry ids, errored steps, and calls when no tokenizer is given come back unchanged.
    Used wherever Steps are made (the assembler) and where they are collected (a rollout given a tokenizer
    object, whose gateway could not load it by path). A tokenizer that fails leaves the step untrainable
    with `metadata["retokenize_error"]`, never fails the call.
    """
    if tokenizer is None or step.token_source != "none" or step.error is not None:
        return step
    metadata = dict(step.metadata)
    try:
        prompt_ids, ids = retokenize(tokenizer, step.endpoint, step.messages, step.prompt, step.text,
                                     step.tool_calls, step.finish_reason, step.params.get("tools"))
    except Exception as exc:
        metadata["retokenize_error"] = f"{type(exc).__name__}: {exc}"
        return step.model_copy(update={"metadata": metadata})
    logprobs = None
    server = step.logprobs if step.logprobs is not None else metadata.get("server_logprobs")
    why = _misaligned(resolve_tokenizer(tokenizer), ids, server, metadata.get("server_logprob_tokens"))
    if why is None:  # the API's logprobs provably belong to our tokens, one by one
        logprobs = list(server)  # type: ignore[arg-type]
        metadata.pop("server_logprobs", None)
        metadata.pop("server_logprob_tokens", None)
    else:
        if step.logprobs is not None:
            metadata["server_logprobs"] = step.logprobs  # kept for inspection, never trained on
        if server is not None:
            metadata["retokenize_mismatch"] = why
    data = step.model_dump()
    data.update(prompt_token_ids=prompt_ids, completion_token_ids=ids, logprobs=logprobs,
                token_policy_versions=None, token_source="retokenized", metadata=metadata)
    return Step.model_validate(data)
