"""Images into a vision-language model: from a request's image parts to prompt ids and image features.

A chat request's image parts (`image_url` with a data or http(s) URL, Responses' `input_image`, Anthropic's
`image` block) are read into bytes (an http URL fetched with a time and size bound), decoded with PIL, and handed
with the rendered chat text to the model's own transformers processor, which expands each image marker into the
image tokens the model expects (SmolVLM: `<fake_token_around_image><global-img><image>×64…`) and computes the
pixel values. Those expanded ids are the prompt ids the server reports and the capture records, so a trainer
scores exactly what was sampled.

The vision tower runs once per request (on the engine thread, on the weights of the request's policy version):
its features replace the embedding rows of the prompt's image tokens (`VisionInputs`), in the engine's packed
steps as in the trainer's forward, which is how transformers merges them (`masked_scatter` over the image token).

A bad image is the request's fault and is said in one line (`BadImage`, a 400): an unreachable URL, bytes that are
no image, an image over MAX_IMAGE_BYTES or MAX_IMAGE_PIXELS.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rllm_rollout.capture.images import hf_messages, image_source

__all__ = ["MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS", "BadImage", "VisionInputs", "decode_image", "encode_prompt",
           "fetch_image", "hf_messages", "image_features", "image_source", "is_vision_model", "pixel_inputs",
           "read_image_sync", "rope_index", "rope_positions", "uses_mrope"]

MAX_IMAGE_BYTES = 20 * 2**20
"""Largest encoded image accepted (OpenAI's own limit per image is 20 MB)."""
MAX_IMAGE_PIXELS = 40_000_000
"""Largest decoded image (width × height): a small file can decode to gigabytes (a decompression bomb)."""
FETCH_TIMEOUT_S = 10.0


class BadImage(ValueError):
    """An image the request carries cannot be used; the message says which and why, in one line."""


def is_vision_model(model: Any) -> bool:
    """The model reads images (its config has a vision tower)."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "vision_config", None) is not None


def _data_url_bytes(url: str) -> bytes:
    head, _, data = url.partition(",")
    if ";base64" not in head:
        raise BadImage(f"image data URL {url[:40]!r}... is not base64-encoded; send data:image/...;base64,...")
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise BadImage(f"image is over {MAX_IMAGE_BYTES // 2**20} MB; send a smaller one")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadImage("image data URL holds invalid base64") from None


async def fetch_image(source: str) -> bytes:
    """The bytes of an image source: a data URL decoded, an http(s) URL fetched (bounded in time and size)."""
    if source.startswith("data:"):
        return _data_url_bytes(source)
    if not source.startswith(("http://", "https://")):
        raise BadImage(f"image URL {source[:60]!r} is neither a data: URL nor http(s)")
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(source) as resp:
            if resp.status != 200:
                raise BadImage(f"image URL {source[:80]} answered HTTP {resp.status}")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > MAX_IMAGE_BYTES:
                    raise BadImage(f"image at {source[:80]} is over {MAX_IMAGE_BYTES // 2**20} MB")
            return bytes(body)
    except BadImage:
        raise
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise BadImage(f"image URL {source[:80]} cannot be fetched ({type(exc).__name__}: {exc})") from None


def read_image_sync(source: str) -> bytes:
    """`fetch_image` for code outside an event loop (a trainer re-reading a row's images)."""
    if source.startswith("data:"):
        return _data_url_bytes(source)
    import httpx

    try:
        resp = httpx.get(source, timeout=FETCH_TIMEOUT_S, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise BadImage(f"image URL {source[:80]} cannot be fetched ({type(exc).__name__}: {exc})") from None
    if resp.status_code != 200:
        raise BadImage(f"image URL {source[:80]} answered HTTP {resp.status_code}")
    if len(resp.content) > MAX_IMAGE_BYTES:
        raise BadImage(f"image at {source[:80]} is over {MAX_IMAGE_BYTES // 2**20} MB")
    return resp.content


def decode_image(data: bytes) -> Any:
    """An RGB PIL image from encoded bytes (size-checked before decoding)."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise BadImage(f"image is over {MAX_IMAGE_BYTES // 2**20} MB; send a smaller one")
    try:
        img = Image.open(io.BytesIO(data))
        if img.width * img.height > MAX_IMAGE_PIXELS:
            raise BadImage(f"image is {img.width}×{img.height} pixels, over the {MAX_IMAGE_PIXELS:,} allowed")
        img.load()
        return img.convert("RGB")
    except BadImage:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise BadImage(f"image cannot be decoded ({' '.join(str(exc).split())[:100]}): send a PNG, JPEG, GIF or "
                       "WebP") from None


@dataclass
class VisionInputs:
    """What a prompt's images add to its ids: the processor's tensors (pixel values, masks or grids), where the
    image tokens are, and the image features once computed (per policy version: a trained vision tower changes
    them)."""

    extras: dict[str, torch.Tensor]
    positions: list[int]
    """Prompt indices of the image tokens, in order: feature row k goes to position positions[k]."""
    digest: str
    """Hash of the images' bytes: KV computed over these image tokens is reused only for the same images."""
    mrope: torch.Tensor | None = None
    """Qwen2-VL's 3-D rotary positions of the prompt's tokens [3, prompt length] (None: 1-D positions)."""
    rope_delta: int = 0
    """With `mrope`: a token after the prompt at index p has position p + rope_delta in all three sections."""
    _features: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.row_of = {p: k for k, p in enumerate(self.positions)}

    def features(self, model: Any, version: int) -> torch.Tensor:
        """[image tokens, hidden] features of these images under `model` (policy `version`), computed once."""
        cached = self._features.get(version)
        if cached is None:
            self._features.clear()  # an older version's features are never needed again by this request
            cached = self._features[version] = image_features(model, self.extras)
            if cached.shape[0] != len(self.positions):
                raise BadImage(f"the processor made {len(self.positions)} image tokens but the vision tower "
                               f"{cached.shape[0]} features: the model and its processor do not match")
        return cached


def _vision_part(model: Any) -> Any:
    """The transformers model under a peft wrapper (the model itself when there is none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@torch.no_grad()
def image_features(model: Any, extras: dict[str, torch.Tensor]) -> torch.Tensor:
    """The projected image features [image tokens, hidden] transformers would merge into the prompt."""
    return image_features_grad(model, extras)


def image_features_grad(model: Any, extras: dict[str, torch.Tensor]) -> torch.Tensor:
    """`image_features` with autograd (a trainer training the vision tower)."""
    inner = _vision_part(model)
    device = next(inner.parameters()).device
    kwargs = {k: v.to(device) for k, v in extras.items()}
    out = inner.get_image_features(**kwargs)
    pooled = getattr(out, "pooler_output", out)
    feats = torch.cat(list(pooled), 0) if isinstance(pooled, list | tuple) else pooled
    return feats.reshape(-1, feats.shape[-1])


def uses_mrope(model: Any) -> bool:
    """The model's text decoder takes 3-D rotary positions (Qwen2-VL's multimodal rope)."""
    cfg = _vision_part(model).config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for name in ("rope_parameters", "rope_scaling"):
        value = getattr(text, name, None)
        if isinstance(value, dict) and "mrope_section" in value:
            return True
    return False


def rope_index(model: Any, ids: Sequence[int], extras: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """Qwen2-VL's 3-D positions [3, len(ids)] of a token sequence with its images (transformers' own
    `get_rope_index`), and the delta a later token adds to its index."""
    inner = _vision_part(model)
    ids_1L = torch.tensor([list(ids)], dtype=torch.long)
    kinds = (ids_1L == image_token_id(model)).int()
    grid = extras.get("image_grid_thw")
    pos, delta = inner.model.get_rope_index(ids_1L, kinds, grid, None, torch.ones_like(ids_1L))
    return pos[:, 0].to(torch.long), int(torch.as_tensor(delta).reshape(-1)[0])


def rope_positions(vision: VisionInputs | None, start: int, n: int) -> torch.Tensor:
    """The 3-D rotary positions [3, n] of tokens start..start+n of a request (1-D ones, repeated, without images)."""
    ps = torch.arange(start, start + n, dtype=torch.long)
    if vision is None or vision.mrope is None:
        return ps.expand(3, n).clone()
    out = (ps + vision.rope_delta).expand(3, n).clone()
    inside = ps < vision.mrope.shape[1]
    out[:, inside] = vision.mrope[:, ps[inside]]
    return out


def image_token_id(model: Any) -> int:
    cfg = _vision_part(model).config
    value = getattr(cfg, "image_token_id", None)
    if value is None:
        value = getattr(cfg, "image_token_index", None)
    if value is None:
        raise BadImage(f"{type(cfg).__name__} names no image token id")
    return int(value)


def pixel_inputs(processor: Any, sources: Sequence[str]) -> dict[str, torch.Tensor]:
    """The image processor's tensors for one prompt's images (read again from their sources), as the processor
    computed them beside the prompt's text when the request was served: a trainer's inputs for those images."""
    images = [decode_image(read_image_sync(src)) for src in sources]
    out = processor.image_processor(images=[images], return_tensors="pt")
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def encode_prompt(processor: Any, model: Any, text: str, images: list[Any]) -> tuple[list[int], VisionInputs | None]:
    """Prompt ids with each image marker of `text` expanded by the model's processor, and the images' inputs
    (None without images)."""
    if not images:
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        return list(ids), None
    try:
        out = processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)
    except (ValueError, TypeError) as exc:  # e.g. markers and images do not match
        raise BadImage(f"the processor refused these images: {' '.join(str(exc).split())[:160]}") from None
    ids = out["input_ids"][0].tolist()
    token = image_token_id(model)
    extras = {k: v for k, v in out.items()
              if k not in ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")}
    digest = hashlib.sha256()
    for img in images:
        digest.update(img.tobytes())
    vision = VisionInputs(extras, [i for i, t in enumerate(ids) if t == token], digest.hexdigest())
    if uses_mrope(model):
        vision.mrope, vision.rope_delta = rope_index(model, ids, extras)
    return ids, vision
