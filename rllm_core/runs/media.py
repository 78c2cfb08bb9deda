"""Images in a run: stored once, by content, under `<run>/media/`; episodes hold references, never base64.

An image an agent sends (an OpenAI `image_url` data URL, a Responses `input_image`, an Anthropic `image` block's
base64 `data`) would otherwise be written into every Step that carries the conversation, every turn, as text
a third larger than the image. When an episode is written (`EpisodeWriter`), each `data:image/...;base64,...`
string in it becomes `rllm-media://<sha256>.<ext>` and the bytes go to `<run>/media/<sha256>.<ext>` (once, however
many steps or episodes repeat them); an Anthropic block's `data` field is replaced the same way. `media_bytes`
reads one back; `inline_media` turns an episode dict back into data URLs (for a trainer, a viewer, a replay).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

__all__ = ["MEDIA_SCHEME", "externalize_media", "inline_media", "media_bytes", "media_dir_for"]

MEDIA_SCHEME = "rllm-media://"
_DATA_URL = re.compile(r"^data:(image/[A-Za-z0-9.+-]+);base64,(.*)$", re.DOTALL)
_EXT = {"image/png": "png", "image/jpeg": "jpg", "image/jpg": "jpg", "image/gif": "gif", "image/webp": "webp"}


def media_dir_for(episodes_path: Path) -> Path:
    """`<run>/media` for `<run>/episodes.jsonl` (eval) and `<run>/episodes/step_N.jsonl` (train)."""
    parent = episodes_path.parent
    return (parent.parent if parent.name == "episodes" else parent) / "media"


def _store(media_dir: Path, mime: str, b64: str) -> str | None:
    try:
        data = base64.b64decode(b64, validate=True)
    except ValueError:
        return None  # not valid base64: left as it came (the server said what it made of it)
    name = f"{hashlib.sha256(data).hexdigest()}.{_EXT.get(mime.lower(), 'bin')}"
    path = media_dir / name
    if not path.exists():
        media_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return MEDIA_SCHEME + name


def _walk(value: Any, media_dir: Path) -> Any:
    if isinstance(value, str):
        m = _DATA_URL.match(value) if value.startswith("data:image/") else None
        return (_store(media_dir, m.group(1), m.group(2)) or value) if m else value
    if isinstance(value, list):
        return [_walk(v, media_dir) for v in value]
    if isinstance(value, dict):
        if value.get("type") == "base64" and str(value.get("media_type", "")).startswith("image/") \
                and isinstance(value.get("data"), str):  # an Anthropic image block's source
            ref = _store(media_dir, str(value["media_type"]), value["data"])
            return {**value, "data": ref} if ref else value
        return {k: _walk(v, media_dir) for k, v in value.items()}
    return value


def externalize_media(line: str, media_dir: Path) -> str:
    """An episode's JSON line with every inline image stored under `media_dir` and referenced (module
    docstring); a line without one comes back as it is, unparsed."""
    if "data:image/" not in line and '"media_type"' not in line:
        return line
    return json.dumps(_walk(json.loads(line), media_dir), ensure_ascii=False)


def media_bytes(ref: str, media_dir: Path) -> bytes:
    """The bytes of `rllm-media://<name>` (FileNotFoundError naming the file when it is gone)."""
    if not ref.startswith(MEDIA_SCHEME) or "/" in ref[len(MEDIA_SCHEME):]:
        raise ValueError(f"not a media reference: {ref[:80]!r}")
    return (media_dir / ref[len(MEDIA_SCHEME):]).read_bytes()


def inline_media(value: Any, media_dir: Path) -> Any:
    """`value` (an episode dict, a message list) with every reference a data URL again."""
    if isinstance(value, str) and value.startswith(MEDIA_SCHEME):
        ext = value.rsplit(".", 1)[-1]
        mime = next((m for m, e in _EXT.items() if e == ext), "application/octet-stream")
        return f"data:{mime};base64,{base64.b64encode(media_bytes(value, media_dir)).decode()}"
    if isinstance(value, list):
        return [inline_media(v, media_dir) for v in value]
    if isinstance(value, dict):
        data = value.get("data")
        if value.get("type") == "base64" and isinstance(data, str) and data.startswith(MEDIA_SCHEME):
            return {**value, "data": base64.b64encode(media_bytes(data, media_dir)).decode()}  # Anthropic's form
        return {k: inline_media(v, media_dir) for k, v in value.items()}
    return value
