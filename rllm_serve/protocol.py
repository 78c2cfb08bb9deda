"""Wire records of the policy server: OpenAI requests (with vLLM's extensions) and how they are validated.

Unknown fields are accepted and ignored (clients send presence_penalty, user, ...), but values we do act on are
checked here so a bad request gets a 400 that names the field, never a traceback from inside the model.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rllm_serve.continuation import ContinueHint
from rllm_serve.sampling import SamplingParams

__all__ = [
    "MAX_TOP_LOGPROBS",
    "ChatRequest",
    "CompletionRequest",
    "RequestError",
    "ResponsesRequest",
    "describe_validation_error",
    "sampling_params",
]

MAX_TOP_LOGPROBS = 20
_INT64 = 2**63


class RequestError(Exception):
    """A request the server refuses; becomes an OpenAI-shaped error body with this HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param

    def body(self) -> dict[str, Any]:
        kind = "not_found_error" if self.status == 404 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=128)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=-_INT64, lt=_INT64)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = False
    ignore_eos: bool = False

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """`"n": null`, `"stream": null` ... mean "the default", as in OpenAI's and vLLM's servers."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, v: str | list[str] | None) -> str | list[str] | None:
        if (isinstance(v, list) and any(not s for s in v)) or v == "":
            raise ValueError("stop strings must be non-empty")
        return v

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    rllm_continue: ContinueHint | None = None
    """rllm's gateway: the previous turn's exact tokens (see `continuation`); other servers never see it."""

    @property
    def max_new(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def n_top(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else 0


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: bool | int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False

    @property
    def max_new(self) -> int | None:
        return self.max_tokens

    @property
    def want_logprobs(self) -> bool:
        return self.logprobs is not None and self.logprobs is not False

    @property
    def n_top(self) -> int:
        # `logprobs: true` (what capture injects) means "the sampled token's logprob", no alternatives
        return 0 if isinstance(self.logprobs, bool) or self.logprobs is None else int(self.logprobs)

    @property
    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise RequestError(f"this server takes one prompt per request, got a list of {len(p)}; "
                                   "send them as separate (concurrent) requests", param="prompt")
            return p[0]  # type: ignore[return-value]
        return p  # type: ignore[return-value]


LOGPROBS_INCLUDE = "message.output_text.logprobs"


class ResponsesRequest(_Request):
    """`POST /v1/responses` (vLLM's `ResponsesRequest` fields this server acts on); rendered as a chat call."""

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    enable_response_messages: bool = False
    """vLLM's field: return the prompt and completion token ids as `input_messages` / `output_messages`."""
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _supported(self) -> ResponsesRequest:
        """Refuse, with what to do instead, what this stateless, function-tools-only server cannot honour."""
        extra = self.model_extra or {}
        if self.n != 1:
            raise ValueError("the Responses API has no n; send n separate requests")
        if (isinstance(self.input, str) and not self.input) or (isinstance(self.input, list) and not self.input):
            raise ValueError("input is empty; send a string or a list of input items")
        if extra.get("previous_response_id"):
            raise ValueError("previous_response_id needs a stored response and this server stores none; "
                             "send the whole conversation as input items (store=false)")
        if extra.get("background"):
            raise ValueError("background responses are not supported here; send the request without background")
        builtin = sorted({str(t.get("type")) for t in self.tools or [] if t.get("type") != "function"})
        if builtin:
            raise ValueError(f"only function tools are served here, not {builtin}; run built-in tools yourself and "
                             "offer them as function tools")
        fmt = ((extra.get("text") or {}).get("format") or {}) if isinstance(extra.get("text"), dict) else {}
        if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
            raise ValueError(f"text.format {fmt.get('type')!r} (structured output) is not supported here; "
                             "ask for JSON in the instructions instead")
        return self

    @property
    def max_new(self) -> int | None:
        return self.max_output_tokens or self.max_tokens

    @property
    def want_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])

    @property
    def n_top(self) -> int:
        return (self.top_logprobs or 0) if self.want_logprobs else 0


def describe_validation_error(exc: ValidationError) -> RequestError:
    """The first problem of a pydantic error as one actionable sentence naming the field and the value."""
    err = exc.errors()[0]
    field = ".".join(str(x) for x in err.get("loc", ())) or "body"
    got = err.get("input")
    shown = "" if isinstance(got, dict) else f" (got {got!r})"
    return RequestError(f"invalid value for {field!r}: {err.get('msg')}{shown}", param=field)


def sampling_params(req: ChatRequest | CompletionRequest | ResponsesRequest, prompt_len: int, context_length: int,
                    default_max_tokens: int | None) -> SamplingParams:
    """Turn a validated request into SamplingParams, refusing prompts that cannot fit the context."""
    room = context_length - prompt_len
    max_new = req.max_new
    if max_new is None:
        if room < 1:
            raise RequestError(f"the prompt has {prompt_len} tokens, which leaves no room in the model's context "
                               f"length of {context_length}; shorten the prompt", param="messages")
        max_new = min(room, default_max_tokens) if default_max_tokens else room
    elif prompt_len + max_new > context_length:
        raise RequestError(
            f"the prompt has {prompt_len} tokens and max_tokens is {max_new}: {prompt_len + max_new} is over the "
            f"model's context length of {context_length}; shorten the prompt or lower max_tokens", param="max_tokens")
    temperature = 1.0 if req.temperature is None else req.temperature
    top_k = None if req.top_k in (None, -1, 0) else req.top_k
    return SamplingParams(
        max_tokens=max_new, temperature=temperature, top_p=1.0 if req.top_p is None else req.top_p, top_k=top_k,
        stop=req.stop_list, seed=req.seed, top_logprobs=req.n_top, ignore_eos=req.ignore_eos,
        stop_token_ids=tuple(req.stop_token_ids or ()),
    )
