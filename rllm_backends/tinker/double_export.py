"""The Tinker double's download surface: what `tinker checkpoint download` (SDK 0.38) calls, offline.

SDK 0.38 downloads a training checkpoint in three calls: `ServiceClient.create_training_client_from_state(path)`,
`TrainingClient.save_weights_external(name, ttl_seconds)` (a temporary ``tinker://<run>/external_weights/<name>``
copy), then `RestClient.get_external_weights_urls(path)` (signed URLs per file) and, after the files are fetched,
`RestClient.delete_checkpoint_from_tinker_path(path)`. Sampler checkpoints cannot be downloaded.

This module adds exactly those calls to the double (a subclass each, the double itself unchanged): the external
copy is the double's weights as ``model.safetensors`` beside its ``meta.json``, and the URLs are ``file://`` URLs,
so a download runs offline with the SDK's own URL handling (urllib). Signatures match the SDK's (tested).

Wire it in with ``RLLM_TINKER_SERVICE=rllm_backends.tinker.double_export:service_export_double_from_env``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import tinker
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture

from rllm_backends.tinker.double import DOUBLE_DIR_ENV, DOUBLE_MODELS_ENV, ServiceDouble
from rllm_backends.tinker.double_model import RestClientDouble, http_error, run_op
from rllm_backends.tinker.double_training import TrainingClientDouble

__all__ = ["ExportRestClientDouble", "ExportServiceDouble", "ExportTrainingClientDouble",
           "service_export_double_from_env"]

URL_TTL = timedelta(hours=1)


class ExportTrainingClientDouble(TrainingClientDouble):
    """A training client that can also write an external-weights copy (`save_weights_external`)."""

    def save_weights_external(self, name: str, ttl_seconds: int | None = None,
                              age_encryption_recipients: list[str] | None = None,
                              ) -> APIFuture[types.SaveWeightsExternalResponse]:
        """The current weights as ``tinker://<run>/external_weights/<name>`` (safetensors + meta.json)."""
        def op() -> types.SaveWeightsExternalResponse:
            from safetensors.torch import save_file

            if not name or "/" in name or name.startswith("."):
                raise http_error(tinker.BadRequestError, 400, f"invalid checkpoint name {name!r}: use a plain name")
            folder = self._service.root / self.model_id / "external_weights" / name
            folder.mkdir(parents=True, exist_ok=True)
            weights = {k: v.detach().contiguous() for k, v in self.policy.state_dict().items()}
            save_file(weights, str(folder / "model.safetensors"))
            (folder / "meta.json").write_text(json.dumps({"base_model": self._base_model, "lora_rank": self._rank}))
            return types.SaveWeightsExternalResponse(path=f"tinker://{self.model_id}/external_weights/{name}",
                                                     type="save_weights_external")

        return run_op(self._service, "save_weights_external", {"name": name}, op)


class ExportRestClientDouble(RestClientDouble):
    """`tinker.RestClient`'s external-weights calls: signed (here: file://) URLs, TTL, delete."""

    def _external(self, tinker_path: str) -> Path:
        try:
            parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
        except ValueError:
            raise http_error(tinker.BadRequestError, 400, f"invalid checkpoint path {tinker_path!r}") from None
        if parsed.checkpoint_type != "external":
            raise http_error(tinker.BadRequestError, 400, f"{tinker_path!r} is not an external weights checkpoint")
        folder = self._service.root / parsed.training_run_id / parsed.checkpoint_id
        if not folder.is_dir():
            raise http_error(tinker.NotFoundError, 404, f"checkpoint {tinker_path!r} not found")
        return Path(folder)

    def get_external_weights_urls(self, tinker_path: str) -> APIFuture[types.ExternalWeightsUrlsResponse]:
        def op() -> types.ExternalWeightsUrlsResponse:
            folder = self._external(tinker_path)
            urls = {p.relative_to(folder).as_posix(): p.resolve().as_uri()
                    for p in sorted(folder.rglob("*")) if p.is_file()}
            return types.ExternalWeightsUrlsResponse(urls=urls, expires=datetime.now(UTC) + URL_TTL)

        return run_op(self._service, "get_external_weights_urls", {"tinker_path": tinker_path}, op)

    def set_checkpoint_ttl_from_tinker_path(self, tinker_path: str, ttl_seconds: int | None) -> APIFuture[None]:
        return run_op(self._service, "set_checkpoint_ttl_from_tinker_path", {"tinker_path": tinker_path},
                      lambda: (self._external(tinker_path), None)[1])

    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> APIFuture[None]:
        return run_op(self._service, "delete_checkpoint_from_tinker_path", {"tinker_path": tinker_path},
                      lambda: shutil.rmtree(self._external(tinker_path)))


class ExportServiceDouble(ServiceDouble):
    """The double whose training clients and rest client also have the download calls."""

    def create_rest_client(self) -> ExportRestClientDouble:
        return ExportRestClientDouble(self)

    def _training_from_state(self, path: str, base_model: str | None, with_optimizer: bool) -> TrainingClientDouble:
        client = super()._training_from_state(path, base_model, with_optimizer)
        client.__class__ = ExportTrainingClientDouble  # same state, one more method
        return client


def service_export_double_from_env() -> ExportServiceDouble:
    """Like `double.service_double_from_env`, with the download calls."""
    root = os.environ.get(DOUBLE_DIR_ENV, "").strip() or tempfile.mkdtemp(prefix="rllm-tinker-double-")
    models = [m.strip() for m in os.environ.get(DOUBLE_MODELS_ENV, "").split(",") if m.strip()]
    return ExportServiceDouble(Path(root), base_models=tuple(models) or ("tiny-random",))
