"""A CPU platform for verl (gloo, Ray resource ``CPU``), registered through verl's own plugin registry.

verl 0.9.1 resolves its device once per process through ``verl.plugin.platform.get_platform()``; the built-in
platforms are ``nvidia``, ``huawei`` (NPU) and ``rocm`` — there is **no CPU platform** (the wheel's ``cpu``
extra only pins CPU torch wheels for verl's CI). With no accelerator, detection falls back to ``nvidia``
(``verl/plugin/platform/platform_manager.py:114-117``), so every ``torch.cuda`` call in the training path fails.

`install()` adds what verl lacks, without touching verl's files:

* `PlatformCPU` registered as ``"cpu"`` in ``PlatformRegistry`` and made the process's platform
  (``set_platform``); ``VERL_PLATFORM=cpu`` and ``VERL_USE_EXTERNAL_MODULES=rllm_backends.verl.cpu_platform``
  are exported so that child processes and Ray actors that ``import verl`` pick the same platform up
  (``verl/__init__.py:49`` imports external modules before anything asks for the platform).
* verl's FSDP language-model engine registered for ``device="cpu"`` (it is registered for ``cuda``/``npu``
  only, ``verl/workers/engine/fsdp/transformer_impl.py:1143``; ``EngineRegistry.get_engine_cls`` raises
  ``ValueError: No engine registered for device='cpu' ...`` otherwise).
* one shim for a verl/trl incompatibility met on the way (`patch_trl_import`; not CPU-specific).

Call `install()` before verl is asked for a device. If verl already fell back to the ``nvidia`` platform and
CUDA is not there, `install()` replaces it and also resets the one device name on the FSDP path that verl
reads at import time (``device_name = get_device_name()``, ``transformer_impl.py:89``); a working accelerator
platform is never replaced.
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry, get_platform, set_platform

__all__ = ["PlatformCPU", "install", "is_installed", "patch_trl_import", "ray_env_vars"]

PLATFORM_NAME = "cpu"
_MODULE = "rllm_backends.verl.cpu_platform"


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _mem_get_info(*_args: Any, **_kwargs: Any) -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda``-style calls verl makes on ``get_torch_device()``."""
    mod = types.ModuleType("rllm_verl_cpu_device")
    for name in ("is_available", "synchronize", "Stream", "Event", "current_stream", "stream", "StreamContext"):
        if hasattr(torch.cpu, name):
            setattr(mod, name, getattr(torch.cpu, name))
    mod.is_available = lambda: True
    mod.current_device = lambda: PLATFORM_NAME
    mod.device_count = lambda: 1
    mod.set_device = _noop
    mod.synchronize = _noop
    mod.empty_cache = _noop
    mod.ipc_collect = _noop
    mod.set_per_process_memory_fraction = _noop
    mod.manual_seed = torch.manual_seed
    mod.manual_seed_all = torch.manual_seed
    mod.get_rng_state = torch.get_rng_state
    mod.set_rng_state = torch.set_rng_state
    mod.get_device_name = lambda *_a, **_k: "cpu"
    mod.mem_get_info = _mem_get_info
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(mod, name, _zero)
    mod.reset_peak_memory_stats = _noop
    return mod


class PlatformCPU(PlatformBase):
    """verl platform for host CPUs: device ``cpu``, collective backend ``gloo``, Ray resource ``CPU``."""

    def __init__(self) -> None:
        self._module = _device_module()

    @property
    def device_name(self) -> str:
        return PLATFORM_NAME

    @property
    def vendor_name(self) -> str:
        return PLATFORM_NAME

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: a CPU is always there, so it must be asked for (VERL_PLATFORM=cpu / install()).
        return False

    def current_device(self) -> Any:  # verl passes this to .to() / FSDP(device_id=); "cpu" works for both
        return PLATFORM_NAME

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "RLLM_VERL_CPU_VISIBLE_DEVICES"  # nothing to hide; verl only reads/forwards it

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_cpus": num_gpus}  # Ray refuses resources={"CPU": n}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


def ray_env_vars() -> dict[str, str]:
    """Env vars for a Ray actor's ``runtime_env`` so that its ``import verl`` selects this platform."""
    return {"VERL_PLATFORM": PLATFORM_NAME, "VERL_USE_EXTERNAL_MODULES": _MODULE}


def is_installed() -> bool:
    return isinstance(get_platform(), PlatformCPU)


def _register_engines() -> None:
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        for backend in ("fsdp", "fsdp2"):
            registry = EngineRegistry._engines.setdefault(model_type, {}).setdefault(backend, {})
            registry.setdefault(PLATFORM_NAME, cls)


def patch_trl_import() -> None:
    """The one shim on verl's code that the CPU path needs (it is not CPU-specific)."""
    import verl.models.transformers.monkey_patch as monkey_patch

    # apply_monkey_patch imports trl's AutoModelForCausalLMWithValueHead whenever trl is installed
    # (verl/models/transformers/monkey_patch.py:352-356) and trl>=1.x (rllm depends on trl) has it at neither
    # path verl tries: ImportError, on any device. The import only patches the value-head model's state_dict,
    # which the actor never builds.
    monkey_patch.is_trl_available = lambda: False


def install() -> PlatformCPU:
    """Make `PlatformCPU` verl's platform in this process (idempotent) and register verl's FSDP engine for it.

    A platform verl already resolved is replaced only if it is unusable here (the ``nvidia`` fallback on a
    machine without CUDA); a working accelerator platform is left alone and RuntimeError raised.
    """
    import sys

    import verl.plugin.platform.platform_manager as pm

    current = pm._current_platform
    if isinstance(current, PlatformCPU):
        platform = current
    else:
        if current is not None and current.is_available():
            raise RuntimeError(
                f"verl already uses the {current.device_name!r} platform in this process, which has that device; "
                "install the CPU platform before anything asks verl for a device, or in a process of its own"
            )
        platform = PlatformCPU()
        set_platform(platform)
        impl = sys.modules.get("verl.workers.engine.fsdp.transformer_impl")
        if impl is not None:  # read at its import (used for the Ulysses mesh only)
            impl.device_name = PLATFORM_NAME
    os.environ.update(ray_env_vars())
    _register_engines()
    patch_trl_import()
    return platform


if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME:
    # Imported through VERL_USE_EXTERNAL_MODULES inside `import verl` (e.g. in a Ray actor): select the platform
    # now; the engine registration waits for the first install() call, since verl is still being imported.
    import verl.plugin.platform.platform_manager as _pm

    if _pm._current_platform is None:
        set_platform(PlatformCPU())
