"""The HTTP side of the policy server: an aiohttp app over a DecodeEngine.

Handlers only validate, tokenize, submit and relay: decoding happens on the engine's thread, and its events
come back to the event loop through `call_soon_threadsafe`, so the loop never blocks on the model. A client
that disconnects cancels its request (aiohttp's handler cancellation, or a failed write while streaming),
and the engine frees its rows before the next decode step.

A peft model with LoRA adapters is served under its own name and under each adapter's name: the request's
`model` picks the adapter (`_route`), any other name gets the server's default adapter (None: the base weights).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from rllm_core.errors import ConfigError
from rllm_rollout.capture.responses_input import chat_tools, input_to_messages
from rllm_serve.continuation import continued_prompt
from rllm_serve.engine import DecodeEngine
from rllm_serve.messages_api import MessagesCall, chat_request_for, stream_messages
from rllm_serve.protocol import (
    ChatRequest,
    CompletionRequest,
    RequestError,
    ResponsesRequest,
    describe_validation_error,
    sampling_params,
)
from rllm_serve.responses import ChoiceResult, ResponseBuilder
from rllm_serve.responses_api import ResponsesBuilder, stream_response
from rllm_serve.sequence import GenerationRequest, TokenEvent
from rllm_serve.tool_prompt import ChatRenderer, tools_in_messages
from rllm_serve.vision import (
    BadImage,
    VisionInputs,
    decode_image,
    encode_prompt,
    fetch_image,
    hf_messages,
    image_source,
)

__all__ = ["MODEL_ALIASES", "check_default_adapter", "engine_adapters", "make_app"]

log = logging.getLogger("rllm.serving.app")

MODEL_ALIASES = ("default",)
"""Model names accepted besides the served one (rllm's engine sends "default" when it is not told a name)."""

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions; chat uses the context room


class _Handlers:
    def __init__(self, engine: DecodeEngine, model_name: str, default_adapter: str | None = None) -> None:
        self.engine = engine
        self.tokenizer = engine.loaded.tokenizer
        self.model_name = model_name
        self.adapters: tuple[str, ...] = engine_adapters(engine)
        self.default_adapter = default_adapter
        self.ctx = engine.loaded.context_length
        self.end_of_turn_ids = frozenset(engine.loaded.eos_token_ids)

    # ------------------------------------------------------------------ small endpoints
    async def health(self, request: web.Request) -> web.Response:
        body = {"status": "ok", "model": self.model_name, "policy_version": self.engine.policy_version,
                "running": self.engine.running, "waiting": self.engine.waiting}
        stats = getattr(self.engine, "stats", None)
        if stats is not None:
            body["kv"] = stats()
        if self.adapters:
            body |= {"adapters": list(self.adapters), "default_adapter": self.default_adapter}
        return web.json_response(body)

    async def models(self, request: web.Request) -> web.Response:
        """The served model, then each LoRA adapter (vLLM lists a LoRA module the same way: `parent` = base)."""
        version = self.engine.policy_version
        card = {"object": "model", "created": 0, "owned_by": "rllm", "max_model_len": self.ctx,
                "policy_version": version}
        data = [{"id": self.model_name, **card}]
        data += [{"id": name, **card, "root": name, "parent": self.model_name} for name in self.adapters]
        return web.json_response({"object": "list", "data": data})

    # ------------------------------------------------------------------ request parsing
    async def _parse(self, request: web.Request,
                     kind: type[ChatRequest] | type[CompletionRequest] | type[ResponsesRequest]) -> Any:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        try:
            req = kind.model_validate(body)
        except ValidationError as exc:
            raise describe_validation_error(exc) from None
        self._route(req)  # an unknown model is a 404 before anything else is checked
        return req

    def _route(self, req: ChatRequest | CompletionRequest | ResponsesRequest) -> tuple[str | None, str]:
        """(the adapter to sample with, the model name the response reports) for a request's `model`.

        An adapter's name picks that adapter and is reported back. Any other name, or none, gets the default
        adapter and reports the served model's name; on a plain model only the served name and the aliases are
        accepted (anything else is a 404), while a server of adapters takes every name, so a client configured
        with some model id still reaches the default policy.
        """
        if req.model is not None and req.model in self.adapters:
            return req.model, req.model
        if self.adapters or req.model is None or req.model in (self.model_name, *MODEL_ALIASES):
            return self.default_adapter, self.model_name
        raise RequestError(f"model {req.model!r} is not served here; this server serves {self.model_name!r} "
                           f"(GET /v1/models lists it)", status=404, param="model")

    async def _chat_prompt(self, req: ChatRequest) -> tuple[list[int], VisionInputs | None]:
        """The prompt ids of a chat request, and its images' inputs when it has any (vision-language model)."""
        processor = getattr(self.engine.loaded, "processor", None)
        refuse_media(req.messages, self.model_name, processor)
        if processor is not None and any(image_source(p) is not None for m in req.messages
                                         if isinstance(m.get("content"), list) for p in m["content"]):
            return await self._vision_prompt(req, processor)
        return self._text_prompt(req), None

    async def _vision_prompt(self, req: ChatRequest, processor: Any) -> tuple[list[int], VisionInputs | None]:
        """Images read (a URL fetched), then the template's text with image markers expanded by the processor."""
        renderer = ChatRenderer(self.tokenizer, req.tools, req.chat_template_kwargs)
        messages = list(req.messages)
        if renderer.tools and not renderer.template_shows_tools:
            messages = tools_in_messages(messages, renderer.tools)
        parts, sources = hf_messages(messages)
        try:
            raw = [await fetch_image(src) for src in sources]

            def encode() -> tuple[list[int], VisionInputs | None]:
                images = [decode_image(b) for b in raw]
                text = self.tokenizer.apply_chat_template(parts, tokenize=False,
                                                          add_generation_prompt=req.add_generation_prompt,
                                                          **renderer.kwargs)
                return encode_prompt(processor, self.engine.model, text, images)

            return await asyncio.to_thread(encode)
        except BadImage as exc:
            raise RequestError(str(exc), param="messages") from None

    def _text_prompt(self, req: ChatRequest) -> list[int]:
        # a template without tools gets them in the Hermes convention, written into the messages
        renderer = ChatRenderer(self.tokenizer, req.tools, req.chat_template_kwargs)
        messages = renderer.messages(list(req.messages))

        def render(msgs: Any, generation_prompt: bool) -> list[int]:
            try:
                return renderer.ids(msgs, generation_prompt)
            except Exception as exc:
                raise RequestError(f"the chat template could not render these messages: {exc}",
                                   param="messages") from None

        if req.rllm_continue is not None and req.add_generation_prompt:
            exact = continued_prompt(req.rllm_continue, messages, render, self.end_of_turn_ids)
            if exact is not None:
                return exact
        return render(messages, req.add_generation_prompt)

    def _completion_prompt(self, req: CompletionRequest) -> list[int]:
        if req.echo:
            raise RequestError("echo=true is not supported by this server; the prompt ids come back as "
                               "prompt_token_ids when you send return_token_ids=true", param="echo")
        prompt = req.single_prompt
        ids = list(self.tokenizer(prompt)["input_ids"]) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise RequestError("the prompt is empty; send some text or token ids", param="prompt")
        vocab = len(self.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", param="prompt")
        return ids

    # ------------------------------------------------------------------ generation
    async def chat(self, request: web.Request) -> web.StreamResponse:
        req: ChatRequest = await self._parse(request, ChatRequest)
        prompt_ids, vision = await self._chat_prompt(req)
        builder = ResponseBuilder(self.tokenizer, self._route(req)[1], True, prompt_ids, req.return_token_ids,
                                  req.logprobs, parse_tools=bool(req.tools))
        return await self._generate(request, req, prompt_ids, builder, None, vision)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req: CompletionRequest = await self._parse(request, CompletionRequest)
        prompt_ids = self._completion_prompt(req)
        builder = ResponseBuilder(self.tokenizer, self._route(req)[1], False, prompt_ids, req.return_token_ids,
                                  req.want_logprobs)
        return await self._generate(request, req, prompt_ids, builder, COMPLETIONS_DEFAULT_MAX_TOKENS)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/responses`: the input rendered as the chat call it is, generated by the same engine."""
        req: ResponsesRequest = await self._parse(request, ResponsesRequest)
        messages = input_to_messages(req.model_dump())
        if not messages:
            raise RequestError("input has no message, function_call or function_call_output items to answer; "
                               "send a string or at least one message item", param="input")
        chat = ChatRequest.model_validate({"messages": messages, "tools": chat_tools(req.tools),
                                           "chat_template_kwargs": req.chat_template_kwargs})
        prompt_ids, vision = await self._chat_prompt(chat)
        builder = ResponsesBuilder(self.tokenizer, self._route(req)[1], prompt_ids, req,
                                   parse_tools=bool(chat.tools))
        return await self._one_reply(request, req, prompt_ids, builder.id,
                                     lambda queue: stream_response(request, queue, builder), builder.full, vision)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/messages` (Anthropic): rendered and generated as the chat call it is (messages_api.py)."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError("the request body is not valid JSON") from None
        req = chat_request_for(body)
        self._route(req)
        prompt_ids, vision = await self._chat_prompt(req)
        builder = ResponseBuilder(self.tokenizer, self._route(req)[1], True, prompt_ids, False, False,
                                  parse_tools=bool(req.tools))  # our fields come from the results themselves
        call = MessagesCall(builder, body)
        return await self._one_reply(request, req, prompt_ids, builder.id,
                                     lambda queue: stream_messages(request, queue, call), call.message, vision)

    async def _one_reply(self, request: web.Request, req: ChatRequest | ResponsesRequest, prompt_ids: list[int],
                         request_id: str, stream: Any, whole: Any, vision: VisionInputs | None = None
                         ) -> web.StreamResponse:
        """One choice, streamed by `stream(queue)` or answered whole as `whole(result)` (Responses, Messages)."""
        gen, queue = self._submit(req, prompt_ids, request_id, None, vision)
        try:
            if req.stream:
                return await stream(queue)
            [result] = await _collect(queue, 1)
            if result.finish_reason in ("error", "abort"):
                return _error(500, f"generation failed: {result.error}")
            return web.json_response(whole(result))
        finally:
            gen.cancel()

    def _submit(self, req: ChatRequest | CompletionRequest | ResponsesRequest, prompt_ids: list[int], request_id: str,
                default_max: int | None, vision: VisionInputs | None = None
                ) -> tuple[GenerationRequest, asyncio.Queue[TokenEvent]]:
        """Hand one request to the engine; its TokenEvents arrive on the returned queue (on this loop)."""
        params = sampling_params(req, len(prompt_ids), self.ctx, default_max)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

        def sink(ev: TokenEvent) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ev)

        gen = GenerationRequest(prompt_ids, params, sink, n=req.n, request_id=request_id, adapter=self._route(req)[0],
                                vision=vision)
        self.engine.submit(gen)
        return gen, queue

    async def _generate(self, request: web.Request, req: ChatRequest | CompletionRequest, prompt_ids: list[int],
                        builder: ResponseBuilder, default_max: int | None, vision: VisionInputs | None = None
                        ) -> web.StreamResponse:
        gen, queue = self._submit(req, prompt_ids, builder.id, default_max, vision)
        try:
            if req.stream:
                return await self._stream(request, req, gen, queue, builder)
            results = await _collect(queue, req.n)
            failed = [r.error for r in results if r.finish_reason in ("error", "abort")]
            if failed:
                return _error(500, f"generation failed: {failed[0]}")
            return web.json_response(builder.full(results))
        finally:
            gen.cancel()  # no-op once finished; frees the rows at once when the client went away

    async def _stream(self, request: web.Request, req: ChatRequest | CompletionRequest, gen: GenerationRequest,
                      queue: asyncio.Queue[TokenEvent], builder: ResponseBuilder) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        pending, produced, version = req.n, 0, None
        if builder.parse_tools:  # tool calls are parsed from whole replies: each choice goes out in one chunk
            results = await _collect(queue, req.n)
            version = results[0].policy_version if results else 0
            first = builder.first_chunk(req.n, version)
            await resp.write((first or b"") + b"".join(builder.whole_chunks(r) for r in results))
            produced, pending = sum(len(r.token_ids) for r in results), 0
        while pending:
            ev = await queue.get()
            if version is None:  # the first chunk waits for the engine: it reports the version actually used
                first = builder.first_chunk(req.n, ev.policy_version)
                if first:
                    await resp.write(first)
            version = ev.policy_version
            if ev.error is not None and ev.finish_reason in ("error", "abort"):
                await resp.write(builder.error_chunk(f"generation failed: {ev.error}"))
            if ev.token_id is not None:
                produced += 1
                await resp.write(builder.token_chunk(ev))
            if ev.finish_reason is not None:
                pending -= 1
                await resp.write(builder.finish_chunk(ev.choice, ev.finish_reason, version))
        if req.include_usage:
            await resp.write(builder.usage_chunk(produced, version or 0))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _collect(queue: asyncio.Queue[TokenEvent], n: int) -> list[ChoiceResult]:
    """Every choice's events gathered until each has finished."""
    results = [ChoiceResult(i) for i in range(n)]
    pending = n
    while pending:
        ev = await queue.get()
        results[ev.choice].add(ev)
        pending -= ev.finish_reason is not None
    return results


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response(RequestError(message, status, param).body(), status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """RequestErrors become OpenAI-shaped 4xx bodies; anything unexpected a 500, and the server keeps going."""
    try:
        return await handler(request)
    except RequestError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPNotFound:  # an unknown route: say where the API is, OpenAI-shaped like every other error
        return _error(404, f"no route {request.method} {request.path} here; the OpenAI API is under /v1 "
                           "(POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, GET /v1/models; "
                           "GET /health)")
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        return _error(405, f"{request.method} {request.path} is not allowed here; use {allowed}")
    except web.HTTPException:
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        log.exception("request failed")
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")


MEDIA_PARTS = ("image_url", "input_image", "image", "input_audio", "audio", "video_url", "file")
"""Content parts that are not text: a model without a processor for them must refuse them, never drop them."""
IMAGE_PARTS = ("image_url", "input_image", "image")
"""The parts a vision-language model reads."""


def refuse_media(messages: list[dict[str, Any]], model_name: str, processor: Any = None) -> None:
    """A 400 naming the first part the served model cannot read: any non-text part for a text-only model, any
    but images for a vision-language one (dropping it and answering anyway would record a sample of another
    question)."""
    for i, message in enumerate(messages):
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in MEDIA_PARTS or (processor is not None and kind in IMAGE_PARTS):
                continue
            if processor is None:
                raise RequestError(f"model {model_name!r} reads text only, and message {i} has an {kind!r} part; "
                                   "serve a vision-language model for images", param="messages")
            raise RequestError(f"model {model_name!r} reads text and images, and message {i} has an {kind!r} part",
                               param="messages")


def engine_adapters(engine: Any) -> tuple[str, ...]:
    """The LoRA adapters an engine serves; () for engines without any (duck-typed ones, e.g. Tinker's, too)."""
    return tuple(getattr(engine, "adapters", ()))


def check_default_adapter(adapters: tuple[str, ...], default_adapter: str | None) -> None:
    """Refuse a default adapter the served model does not hold (None, the base weights, is always fine)."""
    if default_adapter is not None and default_adapter not in adapters:
        held = f"its adapters are {list(adapters)}" if adapters else "it is a plain model, with no adapters"
        raise ConfigError(f"default_adapter {default_adapter!r} is not an adapter of the served model ({held}); "
                          "name one of them, or None for the base weights")


def make_app(engine: DecodeEngine, model_name: str, default_adapter: str | None = None) -> web.Application:
    """The aiohttp application serving `engine` as `model_name` (OpenAI + vLLM fields), and a peft engine's
    LoRA adapters under their own names; other names are served with `default_adapter` (None: base weights)."""
    check_default_adapter(engine_adapters(engine), default_adapter)
    h = _Handlers(engine, model_name, default_adapter)
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_errors])
    app.router.add_post("/v1/chat/completions", h.chat)
    app.router.add_post("/v1/completions", h.completions)
    app.router.add_post("/v1/responses", h.responses)
    app.router.add_post("/v1/messages", h.messages)
    app.router.add_get("/v1/models", h.models)
    app.router.add_get("/health", h.health)
    return app
