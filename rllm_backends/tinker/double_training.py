"""`TrainingClientDouble`: the double of `tinker.TrainingClient` (see `rllm_backends.tinker.double`): forward /
backward with the built-in or a custom loss on the service's tiny model, AdamW steps, checkpoints under the
service's root, sampling clients over frozen copies of the weights."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture
from tinker.lib.public_interfaces.custom_loss import LossHandle, run_loss_handle
from typing_extensions import deprecated

from rllm_backends.tinker.double_model import (
    ASYNC_DEPRECATION,
    BUILTIN_LOSSES,
    SamplingClientDouble,
    TinyPolicy,
    bad_request,
    builtin_loss,
    client_future,
    http_error,
    run_op,
)

if TYPE_CHECKING:
    from rllm_backends.tinker.double import ServiceDouble

__all__ = ["TrainingClientDouble"]

C = TypeVar("C")
_ASYNC_DEPRECATION = ASYNC_DEPRECATION


class TrainingClientDouble:
    """`tinker.TrainingClient`: gradients accumulate over forward_backward calls until optim_step (AdamW)."""

    def __init__(self, service: ServiceDouble, base_model: str, rank: int, policy: TinyPolicy) -> None:
        self._service = service
        self._base_model = base_model
        self._rank = rank
        self.policy = policy
        self.model_id = f"run-{uuid.uuid4().hex[:12]}"
        self.optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-12,
                                           weight_decay=0.0)
        self._inflight: list[TinyPolicy] = []
        self._info = types.GetInfoResponse(type="get_info", model_id=self.model_id, is_lora=True, lora_rank=rank,
                                           model_name=base_model,
                                           model_data=types.ModelData(arch="llama", model_name=base_model))

    # -- forward / backward ---------------------------------------------------------------------------------------
    def _datum_logprobs(self, datum: types.Datum) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs = {k: v.to_torch() for k, v in datum.loss_fn_inputs.items()}
        if "target_tokens" not in inputs:
            raise http_error(tinker.BadRequestError, 400, "loss_fn_inputs needs 'target_tokens' "
                             f"(given: {sorted(inputs)})")
        with bad_request():
            return self.policy.target_logprobs(datum.model_input.to_ints(), inputs["target_tokens"]), inputs

    def _fwd(self, data: list[types.Datum], loss_fn: str, config: Mapping[str, float | str] | None,
             backward: bool) -> types.ForwardBackwardOutput:
        if loss_fn not in BUILTIN_LOSSES:
            raise http_error(tinker.BadRequestError, 400, f"loss_fn {loss_fn!r} is not implemented by the Tinker "
                             f"double; built-in losses it computes: {', '.join(BUILTIN_LOSSES)}")
        outputs, total = [], 0.0
        with torch.set_grad_enabled(backward):
            for datum in data:
                lp, inputs = self._datum_logprobs(datum)
                with bad_request():
                    loss = builtin_loss(loss_fn, lp, inputs, config)
                if backward:
                    loss.backward()
                total += float(loss.detach())
                outputs.append({"logprobs": types.TensorData.from_torch(lp.detach())})
        return types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs,
                                           metrics={"loss:sum": total})

    def forward(self, data: list[types.Datum], loss_fn: types.LossFnType,
                loss_fn_config: Mapping[str, float | str] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """The loss and target logprobs, without gradients."""
        if not data:
            raise ValueError("No data provided")
        return run_op(self._service, "forward", {"n": len(data), "loss_fn": loss_fn},
                      lambda: self._fwd(data, loss_fn, loss_fn_config, backward=False))

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def forward_async(self, data: list[types.Datum], loss_fn: types.LossFnType,
                            loss_fn_config: Mapping[str, float | str] | None = None,
                            ) -> APIFuture[types.ForwardBackwardOutput]:
        return self.forward(data, loss_fn, loss_fn_config)

    def forward_backward(self, data: list[types.Datum], loss_fn: types.LossFnType,
                         loss_fn_config: Mapping[str, float | str] | None = None,
                         ) -> APIFuture[types.ForwardBackwardOutput]:
        """Built-in loss (token SUM, `loss:sum`), its gradient added to what earlier calls accumulated."""
        if not data:
            raise ValueError("No data provided")
        return run_op(self._service, "forward_backward", {"n": len(data), "loss_fn": loss_fn,
                                                          "loss_fn_config": dict(loss_fn_config or {})},
                      lambda: self._fwd(data, loss_fn, loss_fn_config, backward=True))

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def forward_backward_async(self, data: list[types.Datum], loss_fn: types.LossFnType,
                                     loss_fn_config: Mapping[str, float | str] | None = None,
                                     ) -> APIFuture[types.ForwardBackwardOutput]:
        return self.forward_backward(data, loss_fn, loss_fn_config)

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: Callable[..., Any] | LossHandle, *,
                                loss_type_input: Literal["logprobs"] | None = None,
                                ) -> APIFuture[types.ForwardBackwardOutput]:
        """`loss_fn(data, logprobs_list) -> (loss, metrics)` on leaf logprob tensors (shape of target_tokens),
        back-propagated into the model; metrics: yours, `loss:sum` (your loss) and `surrogate_loss:sum`."""
        if not data:
            raise ValueError("No data provided")
        if loss_type_input not in (None, "logprobs"):
            raise ValueError(f"Unsupported loss_type_input={loss_type_input!r}. Supported values are: logprobs")
        return run_op(self._service, "forward_backward_custom", {"n": len(data)},
                      lambda: self._custom(data, loss_fn))

    def _custom(self, data: list[types.Datum], loss_fn: Callable[..., Any] | LossHandle) -> types.ForwardBackwardOutput:
        lps = [self._datum_logprobs(d)[0] for d in data]
        leaves = [lp.detach().clone().requires_grad_(True) for lp in lps]
        loss, metrics = run_loss_handle(loss_fn, data, leaves) if isinstance(loss_fn, LossHandle) \
            else loss_fn(data, leaves)
        loss.backward()
        if any(leaf.grad is None for leaf in leaves):
            raise ValueError("No gradient computed for logprob tensor")
        grads = [leaf.grad for leaf in leaves]
        torch.autograd.backward(lps, grads)
        out_metrics = {k: float(v) for k, v in dict(metrics).items()}
        out_metrics["loss:sum"] = float(loss.detach().sum())
        surrogate = sum(float((lp.detach() * g).sum()) for lp, g in zip(lps, grads, strict=True))
        out_metrics["surrogate_loss:sum"] = surrogate
        return types.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", metrics=out_metrics,
            loss_fn_outputs=[{"logprobs": types.TensorData.from_torch(lp.detach())} for lp in lps])

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def forward_backward_custom_async(self, data: list[types.Datum], loss_fn: Callable[..., Any] | LossHandle,
                                            *, loss_type_input: Literal["logprobs"] | None = None,
                                            ) -> APIFuture[types.ForwardBackwardOutput]:
        return self.forward_backward_custom(data, loss_fn, loss_type_input=loss_type_input)

    def optim_step(self, optim_params: types.OptimParams | None = None, *,
                   adam_params: types.AdamParams | None = None) -> APIFuture[types.OptimStepResponse]:
        """One AdamW step (torch.optim.AdamW semantics, grad_clip_norm > 0 clips the global norm), then zero grads."""
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise TypeError("Expected AdamParams (the Tinker double implements only AdamW)")
        return run_op(self._service, "optim_step", {"adam_params": params}, lambda: self._step(params))

    def _step(self, p: types.AdamParams) -> types.OptimStepResponse:
        for group in self.optimizer.param_groups:
            group.update(lr=p.learning_rate, betas=(p.beta1, p.beta2), eps=p.eps, weight_decay=p.weight_decay)
        if p.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.policy.model.parameters(), p.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)  # as a service would: zero gradients, so AdamW still steps
        return types.OptimStepResponse(metrics=None)

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def optim_step_async(self, optim_params: types.OptimParams | None = None, *,
                               adam_params: types.AdamParams | None = None) -> APIFuture[types.OptimStepResponse]:
        return self.optim_step(optim_params, adam_params=adam_params)

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def _write(self, kind: str, name: str, overwrite: bool, optimizer: bool) -> str:
        if not name or "/" in name or name.startswith("."):
            raise http_error(tinker.BadRequestError, 400, f"invalid checkpoint name {name!r}: use a plain name")
        folder = self._service.root / self.model_id / kind / name
        if (folder / "model.pt").exists() and not overwrite:
            raise http_error(tinker.ConflictError, 409, f"checkpoint {name!r} exists; pass overwrite=True")
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.policy.state_dict(), folder / "model.pt")
        if optimizer:
            torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")
        (folder / "meta.json").write_text(json.dumps({"base_model": self._base_model, "lora_rank": self._rank}))
        return f"tinker://{self.model_id}/{kind}/{name}"

    @staticmethod
    def read_meta(folder: Path) -> dict[str, Any]:
        return dict(json.loads((folder / "meta.json").read_text()))

    @staticmethod
    def read_weights(folder: Path) -> dict[str, torch.Tensor]:
        return dict(torch.load(folder / "model.pt", weights_only=True))

    def restore(self, folder: Path, *, with_optimizer: bool) -> None:
        self.policy.load_state_dict(self.read_weights(folder))
        if with_optimizer:
            self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))

    def save_state(self, name: str, ttl_seconds: int | None = None, overwrite: bool = False,
                   user_metadata: dict[str, str] | None = None) -> APIFuture[types.SaveWeightsResponse]:
        """Weights + AdamW state under root; the response's path reloads them (create_training_client_from_state*)."""
        return run_op(self._service, "save_state", {"name": name}, lambda: types.SaveWeightsResponse(
            path=self._write("weights", name, overwrite, optimizer=True), type="save_weights"))

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def save_state_async(self, name: str, ttl_seconds: int | None = None, overwrite: bool = False,
                               user_metadata: dict[str, str] | None = None) -> APIFuture[types.SaveWeightsResponse]:
        return self.save_state(name, ttl_seconds=ttl_seconds, overwrite=overwrite, user_metadata=user_metadata)

    def _load(self, path: str, optimizer: bool) -> types.LoadWeightsResponse:
        folder = self._service._ckpt_dir(path, kinds=("weights",))
        self.restore(folder, with_optimizer=optimizer)
        return types.LoadWeightsResponse(path=path, model_id=self.model_id, type="load_weights")

    @deprecated("DEPRECATED in the SDK: use ServiceClient.create_training_client_from_state()", category=FutureWarning)
    def load_state(self, path: str, weights_access_token: str | None = None) -> APIFuture[types.LoadWeightsResponse]:
        return run_op(self._service, "load_state", {"path": path}, lambda: self._load(path, optimizer=False))

    @deprecated("DEPRECATED in the SDK: use ServiceClient.create_training_client_from_state()", category=FutureWarning)
    async def load_state_async(self, path: str,
                               weights_access_token: str | None = None) -> APIFuture[types.LoadWeightsResponse]:
        return run_op(self._service, "load_state", {"path": path}, lambda: self._load(path, optimizer=False))

    @deprecated("DEPRECATED in the SDK: use create_training_client_from_state_with_optimizer()",
                category=FutureWarning)
    def load_state_with_optimizer(self, path: str,
                                  weights_access_token: str | None = None) -> APIFuture[types.LoadWeightsResponse]:
        return run_op(self._service, "load_state_with_optimizer", {"path": path},
                      lambda: self._load(path, optimizer=True))

    @deprecated("DEPRECATED in the SDK: use create_training_client_from_state_with_optimizer()",
                category=FutureWarning)
    async def load_state_with_optimizer_async(self, path: str, weights_access_token: str | None = None,
                                              ) -> APIFuture[types.LoadWeightsResponse]:
        return run_op(self._service, "load_state_with_optimizer", {"path": path},
                      lambda: self._load(path, optimizer=True))

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None,
                                 user_metadata: dict[str, str] | None = None,
                                 ) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        """Weights only, as tinker://<run>/sampler_weights/<name> (for create_sampling_client(model_path=...))."""
        return run_op(self._service, "save_weights_for_sampler", {"name": name},
                      lambda: types.SaveWeightsForSamplerResponse(
                          path=self._write("sampler_weights", name, True, optimizer=False),
                          type="save_weights_for_sampler"))

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def save_weights_for_sampler_async(self, name: str, ttl_seconds: int | None = None,
                                             user_metadata: dict[str, str] | None = None,
                                             ) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        return self.save_weights_for_sampler(name, ttl_seconds=ttl_seconds, user_metadata=user_metadata)

    def save_weights_and_get_sampling_client(self, name: str | None = None, retry_config: Any | None = None,
                                             record_stability_info: bool = False,
                                             kind: types.SamplingClientKind = "snapshot",
                                             ) -> APIFuture[SamplingClientDouble]:
        """A sampling client on the current weights: "snapshot" keeps them fixed; "inflight" clients all follow
        the latest inflight save of this training client."""
        def op() -> SamplingClientDouble:
            frozen = self.policy.frozen_copy()
            if kind == "inflight":
                self._inflight[:] = [frozen]
                return SamplingClientDouble(self._service, self._base_model, lambda: self._inflight[0], None)
            return SamplingClientDouble(self._service, self._base_model, lambda: frozen, None)

        return client_future(run_op(self._service, "save_weights_and_get_sampling_client", {"kind": kind}, op))

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def save_weights_and_get_sampling_client_async(self, name: str | None = None, retry_config: Any | None = None,
                                                         record_stability_info: bool = False,
                                                         kind: types.SamplingClientKind = "snapshot",
                                                         ) -> SamplingClientDouble:
        return await self.save_weights_and_get_sampling_client(name, retry_config, record_stability_info, kind)

    def create_sampling_client(self, model_path: str, retry_config: Any | None = None,
                               record_stability_info: bool = False) -> APIFuture[SamplingClientDouble]:
        return self._service.create_sampling_client(model_path=model_path, retry_config=retry_config,
                                                    record_stability_info=record_stability_info)

    @deprecated(_ASYNC_DEPRECATION, category=FutureWarning)
    async def create_sampling_client_async(self, model_path: str, retry_config: Any | None = None,
                                           record_stability_info: bool = False) -> SamplingClientDouble:
        return await self.create_sampling_client(model_path, retry_config, record_stability_info)

    def get_info(self) -> types.GetInfoResponse:
        return self._info

    @deprecated("DEPRECATED in the SDK: use get_info()", category=FutureWarning)
    async def get_info_async(self) -> types.GetInfoResponse:
        return self._info

    def get_tokenizer(self) -> Any:
        return self.policy.tokenizer
