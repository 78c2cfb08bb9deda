"""SFT Steps for a vision-language model: a call captured without token ids, rendered with the model's processor.

A reference oracle (`rllm demos`) or an API model returns no ids, so `rllm sft` renders each call from its messages
and reply. Text is rendered by the chat template alone (sft_data.py); a call whose messages show images is
rendered as the policy server renders it for a vision-language model: the template's text, then the processor,
which expands each image marker into the model's image tokens. The prompt is the conversation with a generation
prompt, the completion what adding the reply appends (up to its end-of-turn token), and the Step keeps the
messages, so its training row carries the images (`TrainRow.images`).
"""

from __future__ import annotations

from typing import Any

from rllm_core.errors import ConfigError
from rllm_core.types import Step
from rllm_rollout.capture.images import hf_messages

__all__ = ["vision_step"]


def _ids(processor: Any, messages: list[dict[str, Any]], images: list[Any], generation_prompt: bool) -> list[int]:
    parts, _ = hf_messages(messages)
    text = processor.tokenizer.apply_chat_template(parts, tokenize=False, add_generation_prompt=generation_prompt)
    out = processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)
    return [int(t) for t in out["input_ids"][0].tolist()]


def vision_step(processor: Any, messages: list[dict[str, Any]], reply: dict[str, Any],
                end_of_turn_ids: frozenset[int], where: str) -> Step | None:
    """The Step of `reply` to `messages` (which show images), ids as the policy server makes them."""
    from rllm_serve.vision import BadImage, decode_image, read_image_sync

    try:
        images = [decode_image(read_image_sync(src)) for src in hf_messages(messages)[1]]
    except BadImage as exc:
        raise ConfigError(f"{where}: an image cannot be read again ({exc})") from None
    prompt = _ids(processor, messages, images, True)
    full = _ids(processor, [*messages, reply], images, False)
    if full[: len(prompt)] != prompt:
        raise ConfigError(f"{where}: the chat template renders the reply so that the text before it changes; its "
                          "tokens cannot be cut out exactly")
    completion = full[len(prompt):]
    ends = [k for k, t in enumerate(completion) if t in end_of_turn_ids]
    if ends:
        completion = completion[: ends[0] + 1]
    if not completion:
        return None
    return Step(messages=list(messages), prompt_token_ids=prompt, completion_token_ids=completion,
                logprobs=[0.0] * len(completion), token_source="retokenized", text=str(reply.get("content") or ""))
