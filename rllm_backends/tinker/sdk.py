"""Reaching the Tinker SDK: its presence and version, the API key, and the ServiceClient to use.

Everything that touches the service gets its `ServiceClient` from `service_client()`, so one switch points the
whole backend (training, sampling, eval) at another implementation of the SDK's client interface:
``RLLM_TINKER_SERVICE=package.module:factory`` names a zero-argument callable returning a ServiceClient-like
object (the in-repo double `rllm_backends.tinker.double:service_double_from_env` is one). Without it, the real
`tinker.ServiceClient()` is built, and `TINKER_API_KEY` must be set.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from rllm_core.errors import ConfigError

__all__ = ["API_KEY_ENV", "SERVICE_ENV", "TINKER_RANGE", "require_api_key", "require_tinker", "rest_client",
           "service_client"]

API_KEY_ENV = "TINKER_API_KEY"
SERVICE_ENV = "RLLM_TINKER_SERVICE"
TINKER_RANGE = (0, 38), (0, 39)
"""Tested SDK versions: at least the first, below the second (pyproject's `rllm[tinker]` pins the same)."""


def require_tinker() -> str:
    """The installed SDK's version, checked against TINKER_RANGE; ConfigError naming the extra when missing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("tinker")
    except PackageNotFoundError:
        raise ConfigError('the tinker backend needs the Tinker SDK: pip install "rllm[tinker]"') from None
    parts = tuple(int(p) for p in found.split(".")[:2] if p.isdigit())
    low, high = TINKER_RANGE
    if not (low <= parts < high):
        raise ConfigError(f"tinker {found} is installed; rllm is tested with tinker>={'.'.join(map(str, low))},"
                          f"<{'.'.join(map(str, high))}: pip install \"rllm[tinker]\" to get that range")
    return found


def require_api_key() -> None:
    """One line naming the variable when no key is set (skipped when RLLM_TINKER_SERVICE names another client)."""
    if os.environ.get(SERVICE_ENV):
        return
    if not os.environ.get(API_KEY_ENV, "").strip():
        raise ConfigError(f"the tinker backend needs an API key: export {API_KEY_ENV}=... "
                          "(create one at https://tinker-console.thinkingmachines.ai)")


def service_client() -> Any:
    """The ServiceClient every Tinker call goes through (see the module docstring)."""
    target = os.environ.get(SERVICE_ENV, "").strip()
    if target:
        module, _, attr = target.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr or "service_client")
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{SERVICE_ENV}={target}: cannot load it ({exc}); give 'package.module:factory'") \
                from None
        return factory()
    require_api_key()
    require_tinker()
    import tinker

    return tinker.ServiceClient()


def rest_client(service: Any) -> Any:
    """The RestClient beside `service` (capabilities, checkpoints): the SDK's own `tinker.RestClient()` for a real
    ServiceClient (SDK 0.38 deprecates `ServiceClient.create_rest_client`), the double's own otherwise."""
    import tinker

    if isinstance(service, tinker.ServiceClient):
        return tinker.RestClient()
    return service.create_rest_client()
