"""Gateway configuration records: one per upstream model server, and the gateway's own options."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rllm_core.roles import role_of_agent
from rllm_rollout.capture.request import is_loopback

__all__ = ["DEFAULT_MAX_BODY_BYTES", "GatewayConfig", "StoreLimits", "UpstreamConfig"]

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


class UpstreamConfig(BaseModel):
    """One OpenAI-compatible model server behind the gateway."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    """Base URL ending in /v1, e.g. http://127.0.0.1:8000/v1."""
    api_key: str | None = Field(default=None, repr=False)
    """Sent upstream as a bearer token; never logged, never stored in Steps, hidden from repr."""
    inject_token_ids: bool | None = None
    """Ask for logprobs + return_token_ids on the client's behalf. None = auto: True for loopback hosts
    (our policy server, a local vLLM), False for hosted APIs (they reject `return_token_ids`)."""
    exact_turns: bool = False
    """Send multi-turn chat calls the previous turn's exact tokens (`rllm_continue`), so sampling and training
    see one token sequence. Only for servers that understand it: rllm's policy server (on for it by default)."""
    timeout_s: float = 600.0
    tokenizer: str | None = None
    """Hugging Face tokenizer path used to retokenize replies from an upstream that returns no token ids."""
    messages_api: Literal["chat", "native"] = "chat"
    """How an Anthropic Messages call (`POST /v1/messages`) reaches this upstream: "chat" translates it to the
    upstream's /chat/completions and the reply back (vLLM, rllm's policy server, any OpenAI-compatible server;
    ids and logprobs kept), "native" forwards it as it is (Anthropic's API, a server with its own /v1/messages)."""
    role_models: dict[str, str] = Field(default_factory=dict)
    """Agent role → the model name sent upstream for its calls ('*': any other role), e.g. each role's LoRA
    adapter on rllm's policy server. Empty: the client's model name is sent unchanged."""

    def model_for(self, agent: str | None) -> str | None:
        """The model name to send for a call by `agent` (`solver#1` plays role `solver`), or None: unchanged."""
        if not self.role_models:
            return None
        return self.role_models.get(role_of_agent(agent or ""), self.role_models.get("*"))

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        url = url.strip().rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream url {url!r} must look like http://HOST:PORT/v1")
        return url

    @field_validator("timeout_s")
    @classmethod
    def _check_timeout(cls, t: float) -> float:
        if t <= 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {t}")
        return t

    @property
    def inject(self) -> bool:
        return is_loopback(self.url) if self.inject_token_ids is None else self.inject_token_ids


class StoreLimits(BaseModel):
    """How long and how much a gateway store keeps, so memory (or the store's file) stays flat over a long run.
    The defaults suit training: an episode takes its session within minutes, so an hour idle means abandoned."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session_ttl_s: float = Field(3600.0, gt=0)
    """An open session with no new step for this long is dropped (counted and logged)."""
    closed_ttl_s: float = Field(3600.0, gt=0)
    """How long a taken/deleted session is remembered, so its late steps are dropped rather than re-opening it."""
    max_closed: int = Field(100_000, ge=1)
    """Closed sessions remembered at most (the oldest forgotten first)."""
    max_sessions: int = Field(100_000, ge=1)
    """Open sessions at most; beyond it the least recently active is dropped (counted and logged)."""
    max_default_steps: int = Field(10_000, ge=1)
    """Steps the `default` session (calls that name no session) keeps; the oldest are dropped beyond it."""
    take_grace_s: float = Field(300.0, gt=0)
    """How long a take's reply is kept for a retry with the same take id (a client that lost the reply)."""


class GatewayConfig(BaseModel):
    """What `create_app` needs: upstreams, the bearer token clients must present (None: no auth), a body limit."""

    model_config = ConfigDict(extra="forbid")

    upstreams: list[UpstreamConfig]
    api_key: str | None = Field(default=None, repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @field_validator("upstreams")
    @classmethod
    def _need_one(cls, ups: list[UpstreamConfig]) -> list[UpstreamConfig]:
        if not ups:
            raise ValueError("the gateway needs at least one upstream (e.g. --upstream http://127.0.0.1:8000/v1)")
        return ups
