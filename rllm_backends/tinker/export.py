"""A Tinker run's checkpoint downloaded through the SDK: the LoRA weights the service trained, as files here.

A Tinker checkpoint (`checkpoints/step_N/tinker_backend.json`) holds no weights, only `tinker://` paths on the
service: the training state (`state_path`) and the sampler weights (`sampler_path`, the same weights). SDK 0.38
cannot download sampler checkpoints; it downloads a training checkpoint by loading it into a training client,
saving a temporary *external weights* copy (`save_weights_external`, with a TTL so a crash leaves nothing behind
for long), asking the RestClient for signed URLs of its files (`get_external_weights_urls`) and deleting the copy
afterwards. That is what `tinker checkpoint download` does; `download_tinker_checkpoint` makes the same calls
through rllm's `service_client()` (so `RLLM_TINKER_SERVICE` points it at the offline double), retrying transient
failures as training does. It starts a training session on the service, which Tinker bills like any other.

The files are the service's adapter (PEFT format on the real service) plus `rllm_export.json` naming the base
model and the paths it came from: merging into the base needs the base weights from the Hub (`peft`'s
`merge_and_unload`), which this step leaves to the user.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from rllm_core.errors import ConfigError
from rllm_train.backend import ExportRequest, ExportResult
from rllm_train.export import prepare_output

__all__ = ["EXPORT_NOTE", "download_tinker_checkpoint", "export_tinker", "is_tinker_checkpoint"]

EXPORT_NOTE = "rllm_export.json"
EXTERNAL_TTL_S = 3600
"""The temporary external copy's lifetime on the service: deleted after the download, expired if we crash."""


def is_tinker_checkpoint(ckpt: Path) -> bool:
    from rllm_backends.tinker.backend import STATE_FILE

    return (Path(ckpt) / STATE_FILE).is_file()


def download_tinker_checkpoint(ckpt: Path, out: Path, service: Any = None) -> list[Path]:
    """Download the weights of Tinker checkpoint `ckpt` into the (empty) folder `out`; the files written."""
    from rllm_backends.tinker.backend import read_checkpoint
    from rllm_backends.tinker.sdk import service_client

    state = read_checkpoint(Path(ckpt))
    source = state.get("state_path")
    if not isinstance(source, str) or not source.startswith("tinker://"):
        raise ConfigError(f"{ckpt}: tinker_backend.json names no tinker:// training state to download")
    own = service is None
    service = service_client() if own else service
    status = "errored"
    try:
        files = _download(service, source, Path(out))
        status = "success"
    finally:
        if own and hasattr(service, "close"):  # end the session the download opened, as `tinker checkpoint` does
            try:
                service.close(status).result(30)
            except Exception:  # the service ends idle sessions itself
                pass
    note = Path(out) / EXPORT_NOTE
    note.write_text(json.dumps({
        "backend": "tinker", "base_model": state.get("base_model"), "lora_rank": state.get("lora_rank"),
        "state_path": source, "sampler_path": state.get("sampler_path"), "steps_done": state.get("steps_done"),
        "note": "LoRA weights trained on the Tinker service; load them on base_model (peft) to use them"},
        indent=2), encoding="utf-8")
    return [*files, note]


def _download(service: Any, source: str, out: Path) -> list[Path]:
    """SDK 0.38's download of a training checkpoint: load it, save a temporary external copy, fetch, delete."""
    from rllm_backends.tinker.retry import call_with_retries
    from rllm_backends.tinker.sdk import rest_client

    rest = rest_client(service)
    training = call_with_retries(lambda: service.create_training_client_from_state(source).result(),
                                 what="create_training_client_from_state")
    name = f"rllm-export-{uuid.uuid4().hex[:8]}"
    external = call_with_retries(lambda: training.save_weights_external(name, ttl_seconds=EXTERNAL_TTL_S).result(),
                                 what="save_weights_external").path
    try:
        urls = call_with_retries(lambda: rest.get_external_weights_urls(external).result(),
                                 what="get_external_weights_urls").urls
        if not urls:
            raise ConfigError(f"the Tinker service returned no files for {source}")
        return [_fetch(url, _inside(out, name)) for name, url in sorted(urls.items())]
    finally:
        try:
            rest.delete_checkpoint_from_tinker_path(external).result()
        except Exception:  # the copy expires after EXTERNAL_TTL_S anyway
            pass


def _inside(out: Path, name: str) -> Path:
    """`out/name`, refused when a file name from the service would land outside `out` (`../x`, absolute)."""
    dest = (out / name).resolve()
    if not dest.is_relative_to(out.resolve()):
        raise ConfigError(f"the Tinker service named a file outside the export folder ({name!r}); download stopped")
    return dest


def _fetch(url: str, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, dest.open("wb") as f:
            shutil.copyfileobj(response, f, length=1 << 20)
    except OSError as exc:
        raise ConfigError(f"downloading {dest.name} from the Tinker service failed ({exc}); run rllm export "
                          "again") from None
    return dest


def export_tinker(ckpt: Path, request: ExportRequest) -> ExportResult:
    """`rllm export` of a Tinker checkpoint: the weights live on the service, and its SDK downloads the adapter."""
    if not request.as_is:
        raise ConfigError(f"{ckpt} is a Tinker checkpoint: its LoRA adapter downloads as is (--format hf); "
                          "merge it into the base with peft afterwards")
    out = prepare_output(request)
    return ExportResult(ckpt, out, download_tinker_checkpoint(ckpt, out), "Tinker LoRA adapter, downloaded")
